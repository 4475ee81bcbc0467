# Reads product lines ("file:line:text", from product-lines.awk) and prints "file:line: name: N lines" for every
# function with a body, N counted from its `fn` line to its closing brace. rustfmt'd code closes a body with a
# `}` alone at the `fn` line's indentation, which is what ends it here; a declaration without a body (a trait's
# `fn f(&self);`) ends at its `;`. POSIX awk (Debian's mawk).
function report() {
  if (name != "") print file ":" start ": " name ": " (end - start + 1) " lines"
  name = ""
}
{
  colon = index($0, ":"); file = substr($0, 1, colon - 1); rest = substr($0, colon + 1)
  colon = index(rest, ":"); lineno = substr(rest, 1, colon - 1) + 0; text = substr(rest, colon + 1)
  if (file != current) { current = file; name = ""; pending = "" }
  if (pending != "") {
    # Inside a multi-line signature: its body opens with `{` at the end of a line, or it has none.
    if (text ~ /;[ \t]*$/ && text !~ /\{/) { pending = ""; next }
    if (text ~ /\{[ \t]*$/) { name = pending; start = pstart; indent = pindent; pending = "" }
    next
  }
  if (name != "") {
    if (text == indent "}") { end = lineno; report() }
    next
  }
  if (match(text, /^[ \t]*(pub(\([a-z:]+\))? )?(const )?(async )?(unsafe )?(extern "C" )?fn [A-Za-z_0-9]+/)) {
    head = substr(text, 1, RLENGTH)
    ind = head; sub(/[^ \t].*$/, "", ind)
    fname = head; sub(/^.*fn /, "", fname)
    if (text ~ /\}[ \t]*,?$/ && text ~ /\{/) next          # a one-line fn
    if (text ~ /;[ \t]*$/) next                              # a declaration
    if (text ~ /\{[ \t]*$/) { name = fname; start = lineno; indent = ind; next }
    pending = fname; pstart = lineno; pindent = ind
  }
}
