#!/usr/bin/env python3
"""No import circle in a package's src/, at any level of its module tree.

Every path a file names into its own crate is an edge to the file of the item it reaches: `use`
trees (nested groups, `self`, `*` and `as` included), paths written inline (`crate::a::X`,
`super::b::f()`), and paths that start with a name the file imported, a glob brought in or it
declared (`use crate::b; … b::c::Z`, a child module `hop::Ledger`). An item a module re-exports
(`pub use`) is followed to the file that defines it, and so is a module's private `use` when a
descendant names it (`super::Y`, `use super::*`). Then, at each module, each child's subtree is
one node (a module split across files is one unit) and the module's own file is left out: a
circle is two or more children that reach each other, and it is printed with the file edges
that close it (exit status 1). Items only a test build has (`#[cfg(test)]`) are left out: a
test may import from anywhere; so are comments and string literals. Not read: paths inside
macros; an inline module (`mod x { … }`) is read as part of its file, so `super` inside one is
taken one level too high (none of the packages' inline modules imports that way across files).

Usage: scripts/check-import-circles.py DIR [DIR ...]   (each a package's src/)
       scripts/check-import-circles.py --self-test       (the forms above, each found)
"""

import os
import re
import sys

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
ROOTS = ("crate", "super", "self")


def clean(text):
    """The text without comments, string and char literals (kept as `""`), so that neither a
    `//` in a URL nor a path in a comment is read as code."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif re.match(r'(?:b?r)(#*)"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'(?:b?r)(#*)"', text[i:])
            end = text.find('"' + m.group(1), i + m.end())
            i = n if end < 0 else end + 1 + len(m.group(1))
            out.append('""')
        elif c == '"' or text.startswith('b"', i) and (i == 0 or not text[i - 1].isalnum()):
            i += 2 if c == "b" else 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:]):
            i += re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:]).end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    text = re.sub(r"\bpub\s*\(\s*in\s+[^)]*\)", "pub", text)  # `pub(in crate::x)` names no import
    return strip_test_modules(text)


TEST_ITEM = re.compile(r"#\[cfg\((?:test|all\(\s*test\b[^\]]*)\)\]")


def strip_test_modules(text):
    """Items only a test build has (`#[cfg(test)]` or `#[cfg(all(test, …))]`: a module, a
    `use`, a function, an impl): a test may import from anywhere."""
    while True:
        m = TEST_ITEM.search(text)
        if not m:
            return text
        i = m.end()
        while True:  # the item's other attributes
            rest = re.match(r"\s*#\[[^\]]*\]", text[i:])
            if not rest:
                break
            i += rest.end()
        semi, brace = text.find(";", i), text.find("{", i)
        if brace < 0 or (0 <= semi < brace):
            end = len(text) if semi < 0 else semi + 1
        else:
            depth, end = 1, brace + 1
            while end < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
        text = text[: m.start()] + text[end:]


MOD_DECL = re.compile(
    r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;"
)


def crates(root):
    """Each crate in the directory (the library, the binary): module path (tuple) -> file."""
    out = []
    for top in ("lib.rs", "main.rs"):
        path = os.path.join(root, top)
        if os.path.exists(path):
            found = {}
            walk(path, (), found, owns_dir=True)
            out.append(found)
    return out


def walk(path, module, found, owns_dir):
    if module in found:
        return
    found[module] = path
    with open(path, encoding="utf-8") as f:
        text = clean(f.read())
    here = os.path.dirname(path)
    base = here if owns_dir else os.path.join(here, os.path.splitext(os.path.basename(path))[0])
    for attrs, name in MOD_DECL.findall(text):
        if TEST_ITEM.search(attrs):
            continue
        child = module + (name,)
        m = re.search(r'#\[path\s*=\s*""\]', attrs)
        raw = re.search(r"#\[path", attrs)
        if raw:
            # The literal was cleaned away: read the attribute from the original text.
            with open(path, encoding="utf-8") as f:
                orig = f.read()
            hit = re.search(r'#\[path\s*=\s*"([^"]+)"\][^;]*?mod\s+' + name + r"\s*;", orig, re.S)
            if hit:
                walk(os.path.normpath(os.path.join(here, hit.group(1))), child, found, owns_dir=False)
            continue
        flat = os.path.join(base, name + ".rs")
        nested = os.path.join(base, name, "mod.rs")
        if os.path.exists(flat):
            walk(flat, child, found, owns_dir=False)
        elif os.path.exists(nested):
            walk(nested, child, found, owns_dir=True)


USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")


def use_tree(tree):
    """`a::{b, c::{self, d as e}, f::*}` -> [(['a','b'], 'b'), (['a','c'], 'c'), …]; a glob has
    alias '*'."""
    tree = re.sub(r"\s+", " ", tree).strip().lstrip(":").strip()
    out = []

    def parse(prefix, s):
        s = s.strip()
        if not s:
            return
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(s):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(s[start:i])
                start = i + 1
        parts.append(s[start:])
        if len(parts) > 1:
            for p in parts:
                parse(prefix, p)
            return
        s = parts[0].strip()
        brace = s.find("{")
        if brace >= 0:
            head = [x.strip() for x in s[:brace].split("::") if x.strip()]
            parse(prefix + head, s[brace + 1 : s.rfind("}")])
            return
        alias = None
        if " as " in s:
            s, alias = [x.strip() for x in s.split(" as ", 1)]
        segs = [x.strip() for x in s.split("::") if x.strip()]
        if not segs:
            return
        if segs == ["self"]:
            out.append((prefix, alias or (prefix[-1] if prefix else "self")))
        elif segs[-1] == "*":
            out.append((prefix + segs[:-1], "*"))
        else:
            out.append((prefix + segs, alias or segs[-1]))

    parse([], tree)
    return out


class Crate:
    def __init__(self, files):
        self.files = files
        self.text = {}
        for module, path in files.items():
            with open(path, encoding="utf-8") as f:
                self.text[module] = clean(f.read())
        # Per module: its `use`s (absolute path, alias, public?), and the names it binds.
        self.uses = {m: [] for m in files}
        for module, text in self.text.items():
            for vis, tree in USE.findall(text):
                for segs, alias in use_tree(tree):
                    absolute = self.absolute(segs, module, local_only=False)
                    if absolute is not None:
                        self.uses[module].append((absolute, alias, bool(vis)))

    def children(self, module):
        return {m[-1] for m in self.files if len(m) == len(module) + 1 and m[: len(module)] == module}

    def absolute(self, segs, module, local_only=True):
        """The crate-absolute path `segs` names from `module`, or None (another crate)."""
        if not segs:
            return None
        first = segs[0]
        if first == "crate":
            return tuple(segs[1:])
        if first == "self":
            return module + tuple(segs[1:])
        if first == "super":
            target = module
            while segs and segs[0] == "super":
                target, segs = target[:-1], segs[1:]
            return target + tuple(segs)
        if first in self.children(module):
            return module + tuple(segs)
        if local_only:
            for absolute, alias, _ in self.uses.get(module, []):
                if alias == first:
                    return absolute + tuple(segs[1:])
            # A module a glob brought in (`use crate::b::*; … c::Z`).
            for absolute, alias, _ in self.uses.get(module, []):
                if alias == "*" and absolute + (first,) in self.files:
                    return absolute + tuple(segs)
        return None

    def targets(self, absolute, glob=False, seen=None, frm=None):
        """The files `absolute` reaches from `frm`: its deepest module, and an item that module
        re-exports followed to where it is defined (`glob`: everything the module re-exports).
        A module's own `use`s are its items for its descendants (`super::Y`, `use super::*`)."""
        seen = set() if seen is None else seen
        if (absolute, glob) in seen:
            return set()
        seen.add((absolute, glob))
        module = ()
        for name in absolute:
            if module + (name,) in self.files:
                module += (name,)
            else:
                break
        rest = absolute[len(module) :]
        reached = {module}
        inside = frm is not None and frm[: len(module)] == module
        for target, alias, public in self.uses.get(module, []):
            if not (public or inside):
                continue
            if glob and not rest:
                reached |= self.targets(target, alias == "*", seen, frm)
            elif rest and alias == rest[0]:
                reached |= self.targets(target + rest[1:], glob, seen, frm)
            elif rest and alias == "*":
                reached |= self.targets(target + rest, glob, seen, frm)
        return reached

    def edges(self):
        out = {m: set() for m in self.files}
        why = {}
        inline = re.compile(r"(?<![A-Za-z0-9_:])(" + IDENT + r"(?:\s*::\s*" + IDENT + r")+|" + r"(?:crate|super|self)\s*::\s*\*)")
        for module, text in self.text.items():
            named = [(a, alias == "*") for a, alias, _ in self.uses[module]]
            body = USE.sub(" ", text)
            for m in inline.finditer(body):
                segs = [s.strip() for s in m.group(1).split("::")]
                absolute = self.absolute(segs, module)
                if absolute is not None:
                    named.append((absolute, False))
            for absolute, glob in named:
                for target in self.targets(absolute, glob, frm=module):
                    if target != module:
                        out[module].add(target)
                        why.setdefault((module, target), "::".join(("crate",) + absolute))
        return out, why

    def level_circles(self, graph, why):
        """At each module, its children's subtrees each one node (a module split across files
        is one unit) and its own file left out: circles among the children, each with the file
        edges that close it."""
        found = []
        for parent in self.files:
            kids = [m for m in self.files if len(m) == len(parent) + 1 and m[: len(parent)] == parent]

            def unit(f):
                return f[: len(parent) + 1] if f[: len(parent)] == parent and f != parent else None

            lifted = {k: set() for k in kids}
            proof = {}
            for a, targets in graph.items():
                ua = unit(a)
                if ua is None:
                    continue
                for t in targets:
                    ut = unit(t)
                    if ut is not None and ut != ua:
                        lifted[ua].add(ut)
                        proof.setdefault((ua, ut), f"{self.files[a]} -> {self.files[t]}  ({why[(a, t)]})")
            for component in circles(lifted):
                members = set(component)
                lines = [proof[(a, b)] for a in sorted(component) for b in sorted(lifted[a] & members)]
                found.append((parent, sorted(component), lines))
        return found


def circles(graph):
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return found


def main(dirs):
    status = 0
    for root in dirs:
        for files in crates(root):
            crate = Crate(files)
            graph, why = crate.edges()
            found = crate.level_circles(graph, why)
            imports = sum(map(len, graph.values()))
            print(f"{files[()]}: {len(files)} files, {imports} imports, {len(found)} circles")
            for parent, component, lines in found:
                status = 1
                names = ", ".join("::".join(m) for m in component)
                print(f"  circle among the modules of {'::'.join(('crate',) + parent)}: {names}")
                for line in lines:
                    print(f"    {line}")
    return status


# Each case: its files, and whether they hold a circle. Every form of path the check reads
# closes a circle in one case; the last cases hold none.
CASES = {
    "use": ({"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::Y; pub struct X;",
             "b.rs": "use crate::a::X; pub struct Y;"}, True),
    "pub use": ({"lib.rs": "mod a; mod b;", "a.rs": "pub use crate::b::Y; pub struct X;",
                 "b.rs": "pub(crate) use crate::a::X; pub struct Y;"}, True),
    "group": ({"lib.rs": "mod a; mod b; mod c;", "a.rs": "use crate::{b::Y, c::Z};",
               "b.rs": "pub struct Y;", "c.rs": "use crate::{a::X};"}, True),
    "nested group": ({"lib.rs": "mod a; mod m;", "a.rs": "use crate::{\n m::{\n inner::W,\n },\n};",
                      "m/mod.rs": "pub mod inner;", "m/inner.rs": "use crate::a::X;"}, True),
    "self in group": ({"lib.rs": "mod a; mod m;", "a.rs": "use crate::{m::{self}}; pub struct X(m::inner::W);",
                       "m/mod.rs": "pub mod inner;", "m/inner.rs": "use crate::a::X;"}, True),
    "super chain": ({"lib.rs": "pub mod p; pub mod s;", "p/mod.rs": "pub mod q;",
                     "p/q/mod.rs": "pub mod r;", "p/q/r.rs": "use super::{super::super::s::S};",
                     "s.rs": "use crate::p::q::r::R;"}, True),
    "re-export": ({"lib.rs": "mod a; mod b;", "a/mod.rs": "mod inner; pub use self::inner::X;",
                   "a/inner.rs": "use crate::b::Y;", "b.rs": "use crate::a::X;"}, True),
    "glob": ({"lib.rs": "mod m;", "m/mod.rs": "mod x; mod y; pub use self::y::Y;",
              "m/x.rs": "use super::*;", "m/y.rs": "use super::x::X;"}, True),
    "imported module": ({"lib.rs": "mod a; mod b;", "a.rs": "use crate::b; pub struct X(b::c::Z);",
                         "b/mod.rs": "pub mod c;", "b/c.rs": "use crate::a::X;"}, True),
    "inline path after a URL": ({"lib.rs": "mod a; mod b;",
                                 "a.rs": 'pub fn u() { let _ = ("http://x", crate::b::Y); }',
                                 "b.rs": "use crate::a::X;"}, True),
    "a child's re-export": ({"lib.rs": "mod m; mod b;", "m/mod.rs": "mod c; use c::Y; pub struct T;",
                             "m/c.rs": "pub use crate::b::Y;", "b.rs": "use crate::m::T;"}, True),
    "through a file of a module and out of another": (
        {"lib.rs": "mod a; mod m;", "a.rs": "use crate::m::T; pub struct X;",
         "m/mod.rs": "mod inner; pub struct T(inner::W);", "m/inner.rs": "use crate::a::X; pub struct W;"}, True),
    "a parent's private use, by super": (
        {"lib.rs": "mod m; mod b;", "m/mod.rs": "mod x; use crate::b::Y;",
         "m/x.rs": "use super::*; pub struct X(Y);", "b.rs": "use crate::m::x::X; pub struct Y;"}, True),
    "a module a glob brought in": ({"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::*; pub struct X(c::Z);",
                                   "b/mod.rs": "pub mod c;", "b/c.rs": "use crate::a::X; pub struct Z;"}, True),
    "a pub(crate) re-export": ({"lib.rs": "mod a; mod b; mod c;", "a.rs": "pub(crate) use crate::c::Z;",
                                "b.rs": "use crate::a::Z;", "c.rs": "use crate::b::Y;"}, True),
    "a raw string": ({"lib.rs": "mod a; mod b;", "a.rs": 'const S: &str = r#"a " b"#; pub fn f() { crate::b::g() } // "',
                      "b.rs": "use crate::a::X;"}, True),
    "a re-export of the parent": ({"lib.rs": "mod m;", "m/mod.rs": "mod x; mod y; pub use self::y::Y;",
                                   "m/x.rs": "use super::Y;", "m/y.rs": "use super::x::X;"}, True),
    "a parent's private use": ({"lib.rs": "mod m;", "m/mod.rs": "mod x; mod y; use y::Y;",
                                "m/x.rs": "use super::Y;", "m/y.rs": "use super::x::X;"}, True),
    "a sibling a glob of the parent brought in": (
        {"lib.rs": "mod m;", "m/mod.rs": "mod x; pub mod z;", "m/x.rs": "use super::*; pub struct X(z::Z);",
         "m/z.rs": "use super::x::X; pub struct Z;"}, True),
    "one way": ({"lib.rs": "mod a; mod b;", "a.rs": "use crate::b::Y;", "b.rs": "pub struct Y;"}, False),
    "a module split across files": ({"lib.rs": "mod m;", "m/mod.rs": "mod x; use x::helper; pub struct T;",
                                     "m/x.rs": "use super::T; pub fn helper() {}"}, False),
    "in comments and strings": ({"lib.rs": "mod a; mod b;", "a.rs": "// crate::b::Y\nconst S: &str = \"crate::b::Y\";",
                                 "b.rs": "use crate::a::X;"}, False),
    "a test module": ({"lib.rs": "mod a; mod b;", "a.rs": "#[cfg(test)]\nmod tests { use crate::b::Y; }",
                       "b.rs": "use crate::a::X;"}, False),
    "test-only items": ({"lib.rs": "mod a; mod b;",
                         "a.rs": "#[cfg(test)]\nuse crate::b::Y;\n#[cfg(all(test, feature = \"x\"))]\nfn f() { crate::b::g() }",
                         "b.rs": "use crate::a::X;"}, False),
}


def self_test():
    import tempfile

    failed = 0
    for name, (files, circle) in CASES.items():
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                    f.write(text + "\n")
            crate = Crate(crates(root)[0])
            found = bool(crate.level_circles(*crate.edges()))
        if found != circle:
            failed += 1
            print(f"self-test {name}: {'found a circle' if found else 'found no circle'}, expected the opposite")
    print(f"self-test: {len(CASES) - failed} of {len(CASES)} cases as expected")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    sys.exit(main(sys.argv[1:] or ["src"]))
