#!/usr/bin/env bash
# The public surface of each published crate, on record: writes
# public-api/<package>.txt, one line per public item reachable from the crate root (its kind and
# path; see scripts/public-api.py for what a line is), sorted. With --check, writes them to a
# temporary directory instead and fails with the diff when they differ from the committed ones.
# Either way it fails when a crate root holds more names than the surface allows (16, the lab
# 12) or when an item is #[deprecated].
#
# The lists come from rustdoc's JSON output (unstable: RUSTC_BOOTSTRAP=1 on the stable toolchain;
# the reader knows format 57, rustc 1.95), all features on, in a target dir of its own
# (target/public-api) so that the main build is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
case "${1:-}" in
    --check) check=1 ;;
    "") ;;
    *) echo "usage: scripts/public-api.sh [--check]" >&2; exit 2 ;;
esac

# package, most names at its root
crates=(
    "tower-retry-safety 16"
    "tower-idempotency-keys 16"
    "retry-safety-lab 12"
)

target_dir=target/public-api
if ((check)); then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
else
    out=public-api
    mkdir -p "$out"
fi

failed=0
for entry in "${crates[@]}"; do
    read -r package max_root <<<"$entry"
    json=$target_dir/doc/${package//-/_}.json
    RUSTC_BOOTSTRAP=1 cargo rustdoc --quiet --locked -p "$package" --lib --all-features \
        --target-dir "$target_dir" -- -Z unstable-options --output-format json
    python3 scripts/public-api.py "$json" --package "$package" --max-root "$max_root" \
        --out "$out/$package.txt" || failed=1
done

if ((check)); then
    for entry in "${crates[@]}"; do
        read -r package _ <<<"$entry"
        if ! diff -u --label "public-api/$package.txt" --label "now" \
            "public-api/$package.txt" "$out/$package.txt"; then
            echo "public-api: the public surface of $package changed: update public-api/ (scripts/public-api.sh) and say so in the CHANGELOG" >&2
            failed=1
        fi
    done
fi
exit "$failed"
