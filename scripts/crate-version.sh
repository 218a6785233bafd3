#!/usr/bin/env bash
# Prints the version of the package whose directory is $1 (default: the root package): its
# manifest's own `version = "..."`, or, with `version.workspace = true`, the root manifest's
# `[workspace.package]` one. Plain text, no cargo: the lab's release and package scripts run it
# where only bash is sure to be (Windows runners, the no-Rust package test).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
manifest="$root/${1:-.}/Cargo.toml"
# The `version` key of one table of a manifest: $1 the table's header, $2 the file.
table_version() {
    awk -v header="$1" '
        /^\[/ { inside = ($0 == header) }
        inside && /^version *= *"/ { sub(/^version *= *"/, ""); sub(/".*/, ""); print; exit }
    ' "$2"
}
version=$(table_version "[package]" "$manifest")
if [ -z "$version" ] && awk '/^\[/ { inside = ($0 == "[package]") } inside && /^version\.workspace *= *true/ { found = 1 } END { exit !found }' "$manifest"; then
    version=$(table_version "[workspace.package]" "$root/Cargo.toml")
fi
[ -n "$version" ] || { echo "crate-version: no version in $manifest" >&2; exit 1; }
echo "$version"
