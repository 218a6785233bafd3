#!/usr/bin/env bash
# tests/README.md is a map of every test file: each file under tests/, server/tests/, lab/tests/,
# e2e/tests/ and testing/tests/ is named in it, and every path it names exists. Prints what
# differs; exits 1 then.
set -euo pipefail
cd "$(dirname "$0")/.."

map=tests/README.md
files=$(git ls-files '*.rs' | grep -E '^(tests|server/tests|lab/tests|e2e/tests|testing/tests)/' | sort -u)
# Paths in backquotes; a pattern such as `tests/<area>/main.rs` or `tests/*.rs` is not a file.
named=$(grep -oE '`(tests|server/tests|lab/tests|e2e/tests|testing/tests)/[^`*<>]+\.rs`' "$map" | tr -d '`' | sort -u)

missing=$(comm -23 <(echo "$files") <(echo "$named"))
stale=$(comm -13 <(echo "$files") <(echo "$named") | while read -r p; do [ -e "$p" ] || echo "$p"; done)

status=0
if [ -n "$missing" ]; then
    echo "test files not in $map:"; echo "$missing" | sed 's/^/  /'; status=1
fi
if [ -n "$stale" ]; then
    echo "paths in $map that do not exist:"; echo "$stale" | sed 's/^/  /'; status=1
fi
exit $status
