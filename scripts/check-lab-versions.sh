#!/usr/bin/env bash
# The lab's packages carry the lab crate's version: fails when the npm manifests (the main
# package and its optionalDependencies on the platform packages), the Python package's
# version source, or the built packages in target/lab-packages/ (if any) say another.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(scripts/crate-version.sh lab)
fail=0
differs() { echo "check-lab-versions: $1 says $2, lab/Cargo.toml (the workspace's) $version" >&2; fail=1; }

# The npm main package, and each platform package it depends on (one per platforms.json entry).
# Read into a variable first: a failure of node inside `< <(…)` would go unnoticed.
npm_versions=$(node -e '
const main = require("./lab/npm/retry-safety-lab/package.json");
const platforms = Object.keys(require("./lab/npm/platforms.json"));
const say = (what, found) => console.log(`${what}\t${found}`);
say("lab/npm/retry-safety-lab/package.json", main.version);
for (const p of platforms) {
  const dep = (main.optionalDependencies || {})[`@retry-safety-lab/${p}`];
  say(`its optionalDependencies["@retry-safety-lab/${p}"]`, dep || "nothing");
}
for (const dep of Object.keys(main.optionalDependencies || {})) {
  if (!platforms.includes(dep.replace("@retry-safety-lab/", ""))) say(`its ${dep} (not in platforms.json)`, "-");
}')
while IFS=$'\t' read -r what found; do
    [ "$found" = "$version" ] || differs "$what" "$found"
done <<<"$npm_versions"

# The wheel's version is Cargo's (maturin): only a static one in pyproject.toml could differ.
if ! grep -q '^dynamic = \["version"\]' lab/python/pyproject.toml; then
    differs lab/python/pyproject.toml "a static version"
fi

# What package-lab.sh built, if it ran.
for built in target/lab-packages/*.whl target/lab-packages/*.tgz; do
    [ -e "$built" ] || continue
    found=$(basename "$built" | sed -n 's/^retry_safety_lab-\([^-]*\)-.*\.whl$/\1/p; s/^.*-\([0-9][^-]*\)\.tgz$/\1/p')
    [ "$found" = "$version" ] || differs "$built" "$found"
done

if ((fail)); then
    echo "check-lab-versions: bump them together (the workspace's version in Cargo.toml, lab/npm/retry-safety-lab/package.json)" >&2
    exit 1
fi
echo "check-lab-versions: all $version"
