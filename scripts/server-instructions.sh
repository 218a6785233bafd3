#!/usr/bin/env bash
# Instructions per keyed request for each variant of server/benches/server/, counted by callgrind:
# (instructions for 20 + N requests − instructions for 20) / N, all of the process (client,
# server and layer share one thread). Needs valgrind; the Redis rows need Redis at REDIS_URL.
#
# Each variant also gets a row without SHA-256's compression (`<variant>.less_sha256`): sha2
# picks its SHA-NI code at run time, and valgrind (3.19 here) does not offer SHA-NI to the
# program it runs, so the count above holds the portable code's rounds, about 3,500
# instructions a block, where a CPU with SHA-NI runs a loop of 171 a block (its disassembly).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
variants=${VARIANTS:-bare memory floor redis}
bin=$(scripts/bench-bin.sh server -p tower-idempotency-keys --all-features)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# Prints the run's instructions, and those of SHA-256's compression (inclusive).
count() {
    local total sha
    total=$(SERVER_ONLY="$1:$2" valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    # awk reads to the end: an early exit would fail the pipe (pipefail).
    sha=$(callgrind_annotate --inclusive=yes --threshold=100 "$out" |
        awk '/sha2::sha256::compress256/ && !n++ { gsub(",", "", $1); print $1 }')
    if callgrind_annotate --threshold=100 "$out" | awk '/sha256::x86::digest_blocks/ { f = 1 } END { exit !f }'; then
        echo "note: the SHA-NI code ran under valgrind" >&2
    fi
    echo "$total ${sha:-0}"
}
declare -A per less
for variant in $variants; do
    read -r zero zero_sha < <(count "$variant" 0)
    read -r many many_sha < <(count "$variant" "$n")
    per[$variant]=$(((many - zero) / n))
    sha=$(((many_sha - zero_sha) / n))
    less[$variant]=$((per[$variant] - sha))
    echo "instr $variant ${per[$variant]}"
    echo "instr $variant.sha256 $sha"
    echo "instr $variant.less_sha256 ${less[$variant]}"
done
ratio() { python3 -c "print('instr $1/$2 %.3f' % ($3 / $4))"; }
if [[ -n ${per[memory]:-} && -n ${per[bare]:-} ]]; then
    ratio memory bare "${per[memory]}" "${per[bare]}"
    ratio memory.less_sha256 bare.less_sha256 "${less[memory]}" "${less[bare]}"
fi
if [[ -n ${per[redis]:-} && -n ${per[floor]:-} ]]; then
    ratio redis floor "${per[redis]}" "${per[floor]}"
    ratio redis.less_sha256 floor.less_sha256 "${less[redis]}" "${less[floor]}"
fi
true
