#!/usr/bin/env python3
"""Reads one crate's rustdoc JSON (`--output-format json`) and writes its public surface: one
line per public item reachable from the crate root, `<kind> <path>`, sorted (scripts/public-api.sh
runs it; public-api/<crate>.txt holds what it wrote).

What a line is:
- every path at which an item is reachable: modules, items, and re-exports resolved to the item
  they name (an item re-exported at two paths has two lines; a re-export of another crate's item
  says which: `struct a::B (re-export of http::B)`);
- under each item's shortest path only: public fields, enum variants, a trait's items and its
  implementations, the items of inherent impls (`fn a::B::new`), each trait impl
  (`impl core::fmt::Debug for a::B`) with its items (`fn a::B::fmt (impl core::fmt::Debug)`),
  and the auto traits a type has (`auto_traits a::B: RefUnwindSafe Send Sync Unpin UnwindSafe`,
  `!Send` where it has not). Blanket impls (`impl<T> From<T> for T` and the like) are left out:
  they follow from the rest.
- `#[non_exhaustive]` after a struct, enum or variant that has it.

Prints `count root_names <crate> N` (names re-exported or defined at the crate root, modules
aside), `count root_modules`, `count items`; exits 1 when the root has more than --max-root
names or when an item is `#[deprecated]` (a first release deprecates nothing). Stdlib only.
"""

import argparse
import json
import sys
from collections import defaultdict

# The auto traits a user can name on stable (rustdoc also reports Freeze and UnsafeUnpin).
AUTO_TRAITS = {"Send", "Sync", "Unpin", "UnwindSafe", "RefUnwindSafe"}
# The rustdoc JSON formats this reader was written against (rustc 1.95: 57). Another one is
# read all the same, with a warning: a new format may rename a field this reader needs.
KNOWN_FORMATS = {57}

KIND_WORD = {
    "module": "mod",
    "struct": "struct",
    "enum": "enum",
    "union": "union",
    "trait": "trait",
    "trait_alias": "trait_alias",
    "type_alias": "type",
    "function": "fn",
    "constant": "const",
    "static": "static",
    "macro": "macro",
    "proc_macro": "proc_macro",
    "primitive": "primitive",
    "extern_crate": "extern_crate",
    "variant": "variant",
    "struct_field": "field",
    "assoc_const": "const",
    "assoc_type": "type",
}


def inner_kind(item):
    return next(iter(item["inner"]))


class Surface:
    def __init__(self, doc):
        self.index = doc["index"]
        self.paths = doc["paths"]
        root = self.index[str(doc["root"])]
        self.crate = root["name"]
        self.root_id = str(doc["root"])
        # id -> every public path it is reachable at (local items only).
        self.reached = defaultdict(set)
        # Lines for re-exports of other crates' items.
        self.external = set()
        self.root_names = set()
        self.root_modules = set()
        self.lines = set()
        self.deprecated = []
        self.canonical = {}

    # -- where each item is reachable --------------------------------------------------------

    def walk(self, module_id, prefix, stack=()):
        if module_id in stack:  # a module re-exported inside itself
            return
        module = self.index[module_id]
        for child in module["inner"]["module"]["items"]:
            self.place(str(child), prefix, stack + (module_id,))

    def place(self, item_id, prefix, stack):
        item = self.index.get(item_id)
        if item is None:
            return
        kind = inner_kind(item)
        if kind == "impl":
            return
        if kind == "use":
            self.place_use(item, prefix, stack)
            return
        if item["visibility"] != "public":
            return
        self.register(item_id, f"{prefix}::{item['name']}", kind, prefix, stack)

    def register(self, item_id, path, kind, prefix, stack):
        self.reached[item_id].add(path)
        if prefix == self.crate:
            (self.root_modules if kind == "module" else self.root_names).add(path)
        if kind == "module":
            self.walk(item_id, path, stack)

    def place_use(self, use_item, prefix, stack):
        if use_item["visibility"] != "public":
            return
        use = use_item["inner"]["use"]
        target = None if use["id"] is None else str(use["id"])
        local = target in self.index if target is not None else False
        if use["is_glob"]:
            if local:
                target_item = self.index[target]
                target_kind = inner_kind(target_item)
                if target_kind == "module":
                    for child in target_item["inner"]["module"]["items"]:
                        self.place(str(child), prefix, stack)
                elif target_kind == "enum":
                    for variant in target_item["inner"]["enum"]["variants"]:
                        v = self.index[str(variant)]
                        self.register(str(variant), f"{prefix}::{v['name']}", "variant", prefix, stack)
            else:
                self.external.add(f"use {prefix}::* (glob re-export of {use['source']})")
                if prefix == self.crate:
                    self.root_names.add(f"{prefix}::*")
            return
        path = f"{prefix}::{use['name']}"
        if local:
            self.register(target, path, inner_kind(self.index[target]), prefix, stack)
            return
        summary = self.paths.get(target) if target is not None else None
        if summary is not None:
            word = KIND_WORD.get(summary["kind"], summary["kind"])
            source = "::".join(summary["path"])
        else:
            word, source = "use", use["source"]
        self.external.add(f"{word} {path} (re-export of {source})")
        if prefix == self.crate:
            self.root_names.add(path)

    # -- rendering types, for impl lines -----------------------------------------------------

    def path_of(self, item_id, written):
        item_id = None if item_id is None else str(item_id)
        if item_id in self.canonical:
            return self.canonical[item_id]
        summary = self.paths.get(item_id) if item_id is not None else None
        if summary is not None:
            return "::".join(summary["path"])
        return written

    def args(self, args):
        if not args:
            return ""
        if "angle_bracketed" in args:
            parts = [self.generic_arg(a) for a in args["angle_bracketed"]["args"]]
            for c in args["angle_bracketed"].get("constraints", []):
                parts.append(self.constraint(c))
            return f"<{', '.join(parts)}>" if parts else ""
        if "parenthesized" in args:
            p = args["parenthesized"]
            out = f"({', '.join(self.ty(t) for t in p['inputs'])})"
            return out + (f" -> {self.ty(p['output'])}" if p.get("output") else "")
        return ""

    def generic_arg(self, arg):
        if arg == "infer":
            return "_"
        if "type" in arg:
            return self.ty(arg["type"])
        if "lifetime" in arg:
            return arg["lifetime"]
        if "const" in arg:
            return arg["const"].get("expr") or arg["const"].get("value") or "_"
        return "_"

    def constraint(self, c):
        name = c["name"] + self.args(c.get("args"))
        binding = c.get("binding", {})
        if "equality" in binding:
            eq = binding["equality"]
            return f"{name} = {self.ty(eq['type']) if 'type' in eq else self.generic_arg(eq)}"
        if "constraint" in binding:
            return f"{name}: {' + '.join(self.bound(b) for b in binding['constraint'])}"
        return name

    def bound(self, b):
        if "trait_bound" in b:
            t = b["trait_bound"]["trait"]
            return self.path_of(t["id"], t["path"]) + self.args(t.get("args"))
        if "outlives" in b:
            return b["outlives"]
        return "_"

    def ty(self, t):
        if t is None or t == "infer":
            return "_"
        kind, v = next(iter(t.items()))
        if kind == "resolved_path":
            return self.path_of(v["id"], v["path"]) + self.args(v.get("args"))
        if kind in ("generic", "primitive"):
            return v
        if kind == "tuple":
            return f"({', '.join(self.ty(x) for x in v)}{',' if len(v) == 1 else ''})"
        if kind == "slice":
            return f"[{self.ty(v)}]"
        if kind == "array":
            return f"[{self.ty(v['type'])}; {v['len']}]"
        if kind == "borrowed_ref":
            life = f"{v['lifetime']} " if v.get("lifetime") else ""
            return f"&{life}{'mut ' if v['is_mutable'] else ''}{self.ty(v['type'])}"
        if kind == "raw_pointer":
            return f"*{'mut' if v['is_mutable'] else 'const'} {self.ty(v['type'])}"
        if kind == "dyn_trait":
            traits = [self.path_of(p["trait"]["id"], p["trait"]["path"]) + self.args(p["trait"].get("args"))
                      for p in v["traits"]]
            if v.get("lifetime"):
                traits.append(v["lifetime"])
            return f"dyn {' + '.join(traits)}"
        if kind == "impl_trait":
            return f"impl {' + '.join(self.bound(b) for b in v)}"
        if kind == "qualified_path":
            trait = v.get("trait")
            self_ty = self.ty(v["self_type"])
            if trait:
                return f"<{self_ty} as {self.path_of(trait['id'], trait['path'])}{self.args(trait.get('args'))}>::{v['name']}"
            return f"{self_ty}::{v['name']}"
        if kind == "function_pointer":
            return "fn(..)"
        return "_"

    def trait_of(self, impl):
        t = impl["trait"]
        return self.path_of(t["id"], t["path"]) + self.args(t.get("args"))

    # -- the lines ---------------------------------------------------------------------------

    def note(self, item, line):
        if item.get("deprecation"):
            self.deprecated.append(line)
        self.lines.add(line)

    def emit(self):
        for item_id, paths in self.reached.items():
            self.canonical[item_id] = min(paths, key=lambda p: (p.count("::"), p))
        for item_id, paths in sorted(self.reached.items()):
            item = self.index[item_id]
            kind = inner_kind(item)
            flag = " #[non_exhaustive]" if "non_exhaustive" in item.get("attrs", []) else ""
            for path in paths:
                self.note(item, f"{KIND_WORD.get(kind, kind)} {path}{flag}")
            self.members(item, kind, self.canonical[item_id])
        self.lines |= self.external
        return sorted(self.lines)

    def fields(self, ids, prefix):
        for n, field in enumerate(ids):
            if field is None:  # a private field of a tuple struct
                continue
            f = self.index[str(field)]
            name = f["name"] if not f["name"].isdigit() else str(n)
            self.note(f, f"field {prefix}::{name}")

    def struct_like(self, kind_inner, prefix):
        k = kind_inner["kind"]
        if k == "unit":
            return
        if "plain" in k:
            self.fields(k["plain"]["fields"], prefix)
        elif "tuple" in k:
            self.fields(k["tuple"], prefix)

    def members(self, item, kind, path):
        inner = item["inner"][kind]
        if kind in ("struct", "union"):
            if kind == "struct":
                self.struct_like(inner, path)
            else:
                self.fields(inner["fields"], path)
        if kind == "enum":
            for variant in inner["variants"]:
                v = self.index[str(variant)]
                vpath = f"{path}::{v['name']}"
                vflag = " #[non_exhaustive]" if "non_exhaustive" in v.get("attrs", []) else ""
                self.note(v, f"variant {vpath}{vflag}")
                vk = v["inner"]["variant"]["kind"]
                if isinstance(vk, dict) and "struct" in vk:
                    self.fields(vk["struct"]["fields"], vpath)
                elif isinstance(vk, dict) and "tuple" in vk:
                    self.fields(vk["tuple"], vpath)
        if kind in ("struct", "enum", "union"):
            self.impls(inner["impls"], path)
        if kind == "trait":
            for member in inner["items"]:
                m = self.index[str(member)]
                self.note(m, f"{KIND_WORD[inner_kind(m)]} {path}::{m['name']}")
            for impl_id in inner["implementations"]:
                impl = self.index[str(impl_id)]["inner"]["impl"]
                if impl["is_synthetic"]:
                    continue
                self.note(self.index[str(impl_id)], f"impl {path}{self.args(impl['trait'].get('args'))} for {self.ty(impl['for'])}")

    def impls(self, impl_ids, path):
        auto = []
        for impl_id in impl_ids:
            impl_item = self.index[str(impl_id)]
            impl = impl_item["inner"]["impl"]
            if impl["is_synthetic"]:
                name = impl["trait"]["path"].split("::")[-1]
                if name in AUTO_TRAITS:
                    auto.append(("!" if impl["is_negative"] else "") + name)
                continue
            if impl["blanket_impl"] is not None:
                continue
            if impl["trait"] is None:
                for member in impl["items"]:
                    m = self.index.get(str(member))
                    if m is None or m["visibility"] != "public":
                        continue
                    self.note(m, f"{KIND_WORD[inner_kind(m)]} {path}::{m['name']}")
                continue
            trait = self.trait_of(impl)
            neg = "!" if impl["is_negative"] else ""
            self.note(impl_item, f"impl {neg}{trait} for {self.ty(impl['for'])}")
            for member in impl["items"]:
                m = self.index.get(str(member))
                if m is None:
                    continue
                self.note(m, f"{KIND_WORD[inner_kind(m)]} {path}::{m['name']} (impl {trait})")
        if auto:
            self.lines.add(f"auto_traits {path}: {' '.join(sorted(auto, key=lambda a: a.lstrip('!')))}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="target/<dir>/doc/<crate>.json")
    parser.add_argument("--package", required=True, help="the package's name, for the counts")
    parser.add_argument("--max-root", type=int, required=True, help="most names at the crate root")
    parser.add_argument("--out", required=True, help="the file to write the list to")
    a = parser.parse_args()

    with open(a.json, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format_version") not in KNOWN_FORMATS:
        print(f"public-api: {a.json}: rustdoc JSON format {doc.get('format_version')}, this reader "
              f"knows {sorted(KNOWN_FORMATS)}: check the lists it writes", file=sys.stderr)
    surface = Surface(doc)
    surface.walk(surface.root_id, surface.crate)
    lines = surface.emit()
    with open(a.out, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))

    several = sum(1 for paths in surface.reached.values() if len(paths) > 1)
    print(f"count root_names {a.package} {len(surface.root_names)}")
    print(f"count root_modules {a.package} {len(surface.root_modules)}")
    print(f"count items {a.package} {len(lines)}")
    print(f"count items_at_several_paths {a.package} {several}")
    failed = False
    if len(surface.root_names) > a.max_root:
        print(f"public-api: {a.package} has {len(surface.root_names)} names at its root, more than "
              f"{a.max_root}: {', '.join(sorted(surface.root_names))}", file=sys.stderr)
        failed = True
    for line in sorted(set(surface.deprecated)):
        print(f"public-api: {a.package}: deprecated in a first release: {line}", file=sys.stderr)
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
