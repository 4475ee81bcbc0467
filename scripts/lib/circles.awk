# Finds import circles between the modules (files) of each crate, for the gates (scripts/lib/gates.sh).
# Input: product-lines.awk's "file:line:text" of every file of the crates; -v roots="a/src/lib.rs b/src/main.rs"
# names the crate roots. The module tree is walked from each root along its `mod name;` declarations.
#
# Module A uses module B when a line of A names a path into B: `use crate::b::X`, `use super::b::{X, Y}`,
# `crate::b::f()`, `b::f()` for a child b of A, `use crate::X` for an X defined in the crate root (a function, a
# type or a `pub(crate) use` macro such as `log!`). The path is resolved to the deepest module it names, so
# `crate::a::b::X` is a use of a::b, not of a. A circle is a set of modules that use one another in a loop
# (a strongly connected component of the uses), parents and children included: a root or mod.rs that calls its
# children and also holds what they import from it is a circle; the shared part belongs in a module of its own.
# Only product code counts (product-lines.awk leaves out #[cfg(test)] items). POSIX awk.

function dirname(p) { sub(/\/[^\/]*$/, "", p); return p }
function root_of(id) { return (index(id, "::") ? substr(id, 1, index(id, "::") - 1) : id) }
function parent_of(id) { if (!index(id, "::")) return id; sub(/::[^:]*$/, "", id); return id }

function walk(file, id, root,    dir, n, i, t, name, child) {
  MODFILE[id] = file
  FILEMOD[file] = id
  IDS[++NIDS] = id
  if (root || file ~ /\/mod\.rs$/) dir = dirname(file)
  else { dir = file; sub(/\.rs$/, "", dir) }
  n = NL[file]
  for (i = 1; i <= n; i++) {
    t = L[file, i]
    if (t !~ /^[ \t]*(pub(\([^)]*\))?[ \t]+)?mod[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*;/) continue
    name = t
    sub(/^[ \t]*(pub(\([^)]*\))?[ \t]+)?mod[ \t]+/, "", name)
    sub(/[ \t]*;.*$/, "", name)
    child = dir "/" name ".rs"
    if (!(child in NL)) child = dir "/" name "/mod.rs"
    if (!(child in NL)) continue
    CHILD[id, name] = 1
    walk(child, id "::" name, 0)
  }
}

# The module a path names, seen from module `id`; "" for a path outside the crate (std, other crates).
function resolve(path, id,    segs, n, i, cur, seg) {
  n = split(path, segs, "::")
  seg = segs[1]
  if (seg == "crate" || seg == "$crate") cur = root_of(id)
  else if (seg == "self") cur = id
  else if (seg == "super") cur = parent_of(id)
  else if ((id, seg) in CHILD) cur = id "::" seg
  else return ""
  for (i = 2; i <= n; i++) {
    seg = segs[i]
    if (seg == "self" || seg == "") continue
    if (seg == "super") { cur = parent_of(cur); continue }
    if ((cur, seg) in CHILD) cur = cur "::" seg
    else break
  }
  return cur
}

function add_edge(from, to, where) {
  if (to == "" || to == from) return
  if ((from, to) in EDGE) return
  EDGE[from, to] = where
  ADJ[from, ++ADJN[from]] = to
}

# Splits `use` text (whitespace removed, `as` renames gone) into its flat paths: a::{b,c::{d}} -> a::b a::c::d.
function expand(prefix, s,    open, depth, i, c, head, inner, part, start, out) {
  open = index(s, "{")
  if (!open) return prefix s "\n"
  head = prefix substr(s, 1, open - 1)
  depth = 0; out = ""; start = open + 1
  for (i = open; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "{") depth++
    else if (c == "}") { depth--; if (depth == 0) { part = substr(s, start, i - start); if (part != "") out = out expand(head, part); break } }
    else if (c == "," && depth == 1) { part = substr(s, start, i - start); if (part != "") out = out expand(head, part); start = i + 1 }
  }
  return out
}

function scan_paths(id, t, where,    rest, p, before, m) {
  rest = t
  while (match(rest, /\$?(crate|super|self)(::[A-Za-z_][A-Za-z0-9_]*)+/)) {
    before = (RSTART > 1) ? substr(rest, RSTART - 1, 1) : " "
    p = substr(rest, RSTART, RLENGTH)
    if (before !~ /[A-Za-z0-9_:]/) add_edge(id, resolve(p, id), where)
    rest = substr(rest, RSTART + RLENGTH)
  }
  rest = t
  while (match(rest, /[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)+/)) {
    before = (RSTART > 1) ? substr(rest, RSTART - 1, 1) : " "
    p = substr(rest, RSTART, RLENGTH)
    m = p; sub(/::.*$/, "", m)
    if (before !~ /[A-Za-z0-9_:$]/ && (id, m) in CHILD) add_edge(id, resolve(p, id), where)
    rest = substr(rest, RSTART + RLENGTH)
  }
}

function scan(id,    file, n, i, t, stmt, start, paths, np, k, where, reexport, target) {
  file = MODFILE[id]
  n = NL[file]
  for (i = 1; i <= n; i++) {
    t = L[file, i]
    where = file ":" LN[file, i]
    if (t ~ /^[ \t]*(pub(\([^)]*\))?[ \t]+)?use[ \t]/) {
      stmt = t
      reexport = (t ~ /^[ \t]*pub/)
      while (stmt !~ /;/ && i < n) { i++; stmt = stmt " " L[file, i] }
      sub(/^[ \t]*(pub(\([^)]*\))?[ \t]+)?use[ \t]+/, "", stmt)
      sub(/;.*$/, "", stmt)
      gsub(/[ \t]+as[ \t]+[A-Za-z_0-9]+/, "", stmt)
      gsub(/[ \t]/, "", stmt)
      sub(/^::/, "", stmt)
      np = split(expand("", stmt), paths, "\n")
      for (k = 1; k <= np; k++) {
        if (paths[k] == "") continue
        target = resolve(paths[k], id)
        # A parent re-exporting what its children define is their facade, not a user of them.
        if (reexport && index(target, id "::") == 1) continue
        add_edge(id, target, where)
      }
      continue
    }
    scan_paths(id, t, where)
  }
}

# Tarjan's strongly connected components.
function connect(v,    k, w) {
  INDEX[v] = LOW[v] = ++COUNTER
  STACK[++SP] = v; ONSTACK[v] = 1
  for (k = 1; k <= ADJN[v]; k++) {
    w = ADJ[v, k]
    if (!(w in INDEX)) { connect(w); if (LOW[w] < LOW[v]) LOW[v] = LOW[w] }
    else if (ONSTACK[w] && INDEX[w] < LOW[v]) LOW[v] = INDEX[w]
  }
  if (LOW[v] == INDEX[v]) {
    NSCC++
    do { w = STACK[SP--]; ONSTACK[w] = 0; SCC[w] = NSCC; SIZE[NSCC]++ } while (w != v)
  }
}

{
  i = index($0, ":"); f = substr($0, 1, i - 1); rest = substr($0, i + 1)
  j = index(rest, ":")
  n = ++NL[f]; LN[f, n] = substr(rest, 1, j - 1); L[f, n] = substr(rest, j + 1)
}

END {
  nr = split(roots, R, " ")
  for (r = 1; r <= nr; r++) if (R[r] in NL) walk(R[r], R[r], 1)
  for (k = 1; k <= NIDS; k++) scan(IDS[k])
  for (k = 1; k <= NIDS; k++) if (!(IDS[k] in INDEX)) connect(IDS[k])
  found = 0
  for (c = 1; c <= NSCC; c++) {
    if (SIZE[c] < 2) continue
    found++
    members = ""
    for (k = 1; k <= NIDS; k++) if (SCC[IDS[k]] == c) members = members " " MODFILE[IDS[k]]
    print "circle:" members
    for (k = 1; k <= NIDS; k++) {
      v = IDS[k]
      if (SCC[v] != c) continue
      for (e = 1; e <= ADJN[v]; e++) {
        w = ADJ[v, e]
        if (SCC[w] == c) print "  " MODFILE[v] " uses " MODFILE[w] " (" EDGE[v, w] ")"
      }
    }
  }
  exit found ? 1 : 0
}
