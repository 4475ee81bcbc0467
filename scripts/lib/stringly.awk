# Finds stringly errors in product-lines.awk's "file:line:text", for the gates (scripts/lib/gates.sh):
# - a `Result` whose error type is `String` or `&str` (a signature, a closure, a channel, a type alias):
#   `Result<T, String>`, `std::result::Result<T, &'static str>`, but not `Result<BTreeMap<String, String>>`;
# - a `map_err` that turns an error into text: `.map_err(|e| e.to_string())`, `.map_err(|e| format!(..))`,
#   `.map_err(ToString::to_string)`, `.map_err(|e| e.msg)`, `.map_err(|_| "..".to_string())`;
# - an error enum's variant built from text: `Error::Config(format!(..))`, `StoreError::X("..".into())`,
#   `Error::X(String::from(..))` (a variant that holds a String; give it the values as fields instead).
#   cnicore's `Error::config(format!(..))` is a constructor of the CNI error object (a code and a message), not
#   a variant, and is not counted.
# POSIX awk.

# The top-level generic arguments of the `<...>` starting at s[open], split by commas; "" when unclosed.
function second_arg(s, open,    i, c, prev, depth, start, nargs, arg) {
  depth = 0; nargs = 0; start = open + 1; prev = ""
  for (i = open; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "<") depth++
    else if (c == ">" && prev != "-") {
      depth--
      if (depth == 0) { nargs++; if (nargs == 2) return substr(s, start, i - start); return "" }
    } else if (c == "," && depth == 1) {
      nargs++
      if (nargs == 2) return ""
      start = i + 1
    }
    prev = c
  }
  return ""
}

{
  i = index($0, ":"); rest = substr($0, i + 1); j = index(rest, ":")
  where = substr($0, 1, i + j - 1); t = substr(rest, j + 1)
  s = t; hit = 0
  while (match(s, /(^|[^A-Za-z0-9_])Result</)) {
    open = RSTART + RLENGTH - 1
    arg = second_arg(s, open)
    gsub(/[ \t]/, "", arg)
    if (arg ~ /^(std::string::)?String$/ || arg ~ /^&('[a-z_]+)?str$/) { hit = 1; break }
    s = substr(s, open + 1)
  }
  if (t ~ /map_err\([ \t]*\|[^|]*\|[ \t]*(format!|String::from|[A-Za-z_][A-Za-z0-9_.]*\.(to_string|to_owned)\(\)[ \t]*\)|"[^"]*"\.(to_string|to_owned|into)\(\)|[a-z_]+\.msg[ \t]*\))/ ||
      t ~ /map_err\([ \t]*(ToString|String|str)::/ ||
      t ~ /(^|[^A-Za-z0-9_])[A-Za-z0-9_]*Error::[A-Z][A-Za-z0-9_]*\([ \t]*(format!|String::from|"[^"]*"\.(to_string|to_owned|into)\(\))/)
    hit = 1
  if (hit) print where ": " t
}
