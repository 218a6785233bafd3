#!/usr/bin/env bash
# Fails if a locked dependency declares a `rust-version` above ours: the declared MSRV must be
# one the committed lockfile builds with. Checks every package the lockfile resolves with all
# features, dev-dependencies included (`cargo test` uses them too); also prints the highest
# among what the library alone pulls in. Needs only cargo and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -d '' check <<'PY' || true
import json, sys

meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]

def version(text):
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

def reachable(kinds_from_root):
    """Packages reachable from the root; beyond it, only normal and build edges count."""
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        allowed = kinds_from_root if node == root else (None, "build")
        for dep in nodes[node]["deps"]:
            if any(k["kind"] in allowed for k in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    seen.discard(root)
    return seen

def highest(ids):
    found = [(version(packages[i]["rust_version"]), packages[i]) for i in ids
             if packages[i].get("rust_version")]
    return max(found, key=lambda f: f[0], default=(None, None))

declared = packages[root].get("rust_version")
if not declared:
    sys.exit("check-msrv: Cargo.toml declares no rust-version")
everything = reachable((None, "build", "dev"))
lib_version, lib_pkg = highest(reachable((None, "build")))
if lib_pkg:
    print(f"check-msrv: the library needs {lib_pkg['rust_version']} ({lib_pkg['name']} {lib_pkg['version']})")
too_new = sorted(
    (version(packages[i]["rust_version"]), packages[i]["name"], packages[i]["version"],
     packages[i]["rust_version"])
    for i in everything
    if packages[i].get("rust_version")
    and version(packages[i]["rust_version"]) > version(declared)
)
if too_new:
    for _, name, ver, rv in reversed(too_new):
        print(f"check-msrv: {name} {ver} needs Rust {rv}, above rust-version {declared}")
    sys.exit(1)
print(f"check-msrv: rust-version {declared} covers all {len(everything)} locked dependencies")
PY

cargo metadata --format-version 1 --all-features --locked | python3 -c "$check"
