#!/usr/bin/env python3
"""No import circle in a package's src/: files are nodes, `use` paths are edges.

Each `use crate::…`, `use super::…` and `use self::…` (and such a path written inline,
`crate::a::b::C`) is an edge from the file it is written in to the file of the deepest module
the path names. A module's own file (`mod.rs`, `lib.rs`) declaring or re-exporting its children
is how Rust builds the tree, not an import: edges from a module to its descendants are left
out, as are imports inside inline `#[cfg(test)]` modules. A circle is then two or more files that reach each other (a strongly connected component);
each is printed with the imports that close it, and the exit status is 1.

Usage: scripts/check-import-circles.py DIR [DIR ...]   (each a package's src/)
"""

import os
import re
import sys

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", re.M)
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;')


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(line.split("//", 1)[0] for line in text.splitlines())
    return strip_test_modules(text)


TEST_MODULE = re.compile(r"#\[cfg\(test\)\]\s*mod\s+[A-Za-z_][A-Za-z0-9_]*\s*\{")


def strip_test_modules(text):
    """Inline `#[cfg(test)] mod … { … }` blocks: a test may import from anywhere."""
    while True:
        m = TEST_MODULE.search(text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]


def crates(root):
    """Each crate in the directory (the library, the binary): module path (tuple) -> file,
    following `mod x;` from its lib.rs or main.rs."""
    out = []
    for top in ("lib.rs", "main.rs"):
        path = os.path.join(root, top)
        if os.path.exists(path):
            found = {}
            walk(path, (), found, is_dir_owner=True)
            out.append(found)
    return out


def walk(path, module, found, is_dir_owner):
    if module in found:
        return
    found[module] = path
    with open(path, encoding="utf-8") as f:
        text = strip_comments(f.read())
    here = os.path.dirname(path)
    base = here if is_dir_owner else os.path.join(here, os.path.splitext(os.path.basename(path))[0])
    attributed = {}
    for target, name in PATH_ATTR.findall(text):
        attributed[name] = os.path.normpath(os.path.join(here, target))
    for name in MOD_DECL.findall(text):
        child = module + (name,)
        if name in attributed:
            walk(attributed[name], child, found, is_dir_owner=False)
            continue
        flat = os.path.join(base, name + ".rs")
        nested = os.path.join(base, name, "mod.rs")
        if os.path.exists(flat):
            walk(flat, child, found, is_dir_owner=False)
        elif os.path.exists(nested):
            walk(nested, child, found, is_dir_owner=True)
    # Inline modules (`mod tests { … }`) stay in their file: paths into them resolve to it.


def resolve(kind, segments, module, files):
    if kind == "crate":
        target = ()
    elif kind == "self":
        target = module
    else:
        target = module[:-1]
        while segments and segments[0] == "super":
            target = target[:-1]
            segments = segments[1:]
    best = target
    for name in segments:
        if target + (name,) in files:
            target = target + (name,)
            best = target
        else:
            break
    return best


def edges(files):
    out = {m: set() for m in files}
    why = {}
    for module, path in files.items():
        with open(path, encoding="utf-8") as f:
            text = strip_comments(f.read())
        paths = []
        for kind, prefix, inner in USE_GROUP.findall(text):
            for item in re.split(r"[,{}\s]+", inner):
                item = item.split(" as ")[0].strip()
                if item and item != "self":
                    paths.append((kind, prefix.strip(":").split("::") + item.split("::")))
        for kind, rest in PATH.findall(text):
            paths.append((kind, rest.strip(":").split("::")))
        for kind, segments in paths:
            segments = [s for s in segments if s]
            target = resolve(kind, segments, module, files)
            if target == module or target[: len(module)] == module:
                continue  # itself, or a module declaring and re-exporting its descendants
            out[module].add(target)
            why.setdefault((module, target), f"{kind}::{'::'.join(segments)}")
    return out, why


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
            graph, why = edges(files)
            found = circles(graph)
            name = files[()]
            print(f"{name}: {len(files)} files, {sum(map(len, graph.values()))} imports, {len(found)} circles")
            for component in found:
                status = 1
                members = set(component)
                print("  circle:", ", ".join(sorted(files[m] for m in component)))
                for a in sorted(component):
                    for b in sorted(graph[a] & members):
                        print(f"    {files[a]} -> {files[b]}  ({why[(a, b)]})")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["src"]))
