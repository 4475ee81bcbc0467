# Prints the product code of the Rust files given as arguments, one "file:line:text" per line, for the gates
# (scripts/lib/gates.sh): comment lines and trailing comments removed, and every item under #[cfg(test)] left
# out (a `mod tests { ... }` block, a test-only function, or a `mod name;` declaration), since the gates are
# about the code that ships. POSIX awk (Debian's mawk), no gawk extensions.
FNR == 1 { skipping = 0; depth = 0; opened = 0 }
{
  line = $0
  if (line ~ /^[ \t]*\/\//) next
  sub(/[ \t]+\/\/.*$/, "", line)
  if (!skipping && line ~ /^[ \t]*#\[cfg\(test\)\]/) { skipping = 1; depth = 0; opened = 0; next }
  if (skipping) {
    if (line ~ /^[ \t]*#\[/) next
    opens = gsub(/\{/, "{", line); closes = gsub(/\}/, "}", line)
    depth += opens - closes
    if (opens > 0) opened = 1
    # The item ends where its braces close, or at its `;` when it has none (`mod memory;`).
    if ((opened && depth <= 0) || (!opened && line ~ /;[ \t]*$/)) skipping = 0
    next
  }
  print FILENAME ":" FNR ":" line
}
