#!/usr/bin/env bash
# Builds a bench without running it and prints its executable's path:
# scripts/bench-bin.sh <bench> [cargo options...]
set -euo pipefail
name=$1
shift
cargo bench --bench "$name" "$@" --no-run --message-format=json 2>/dev/null |
    BENCH="$name" python3 -c 'import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["BENCH"] and m.get("executable"):
        print(m["executable"])'
