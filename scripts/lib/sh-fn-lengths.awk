# Prints "file:line: name: N lines" for every shell function of the files given, N counted from its `name() {`
# line to the `}` that closes it at the same indentation (shfmt's layout: a body closes at the indentation it
# opened at). POSIX awk (Debian's mawk).
FNR == 1 { name = "" }
name != "" && $0 == indent "}" { print FILENAME ":" start ": " name ": " (FNR - start + 1) " lines"; name = ""; next }
name == "" && match($0, /^[ \t]*[A-Za-z_][A-Za-z_0-9:-]*\(\)[ \t]*\{[ \t]*(#.*)?$/) {
  indent = $0; sub(/[^ \t].*$/, "", indent)
  name = $0; sub(/^[ \t]*/, "", name); sub(/\(.*$/, "", name)
  start = FNR
}
