#!/usr/bin/env bash
# Documents every package of the workspace (`--no-deps`, all features), each after the packages
# it links to.
#
# rustdoc makes a link to another crate's item only if that crate's pages are already in
# target/doc, and cargo removes a package's pages before it documents the package again. In one
# `cargo doc --workspace`, cargo runs rustdoc on a package once its dependencies are *checked*,
# not documented: a fresh clone's run documented the lab while the server's pages were missing,
# and rustdoc left the lab's links to `IdempotencyLayer` as text, without a warning. So one cargo
# command per layer, in dependency order; each documents only the packages it names.
set -euo pipefail
cd "$(dirname "$0")/.."

layers=(
    "tower-retry-safety"
    "tower-idempotency-keys"
    "retry-safety-lab retry-safety-testing"
    "retry-safety-e2e"
)

# A new member must be placed in a layer (after the packages it links to).
listed=$(printf '%s\n' "${layers[@]}" | tr ' ' '\n' | sort)
members=$(cargo metadata --no-deps --format-version 1 \
    | perl -MJSON::PP -0777 -ne 'print "$_->{name}\n" for @{decode_json($_)->{packages}}' | sort)
if [ "$listed" != "$members" ]; then
    echo "scripts/doc.sh: its layers do not list the workspace's members:" >&2
    diff <(echo "$listed") <(echo "$members") >&2 || true
    exit 1
fi

for layer in "${layers[@]}"; do
    args=()
    for package in $layer; do args+=(-p "$package"); done
    RUSTDOCFLAGS="${RUSTDOCFLAGS:--Dwarnings}" cargo doc "${args[@]}" --no-deps --all-features
done
