#!/usr/bin/env bash
# Instructions per keyed request for each variant of benches/server.rs, counted by callgrind:
# (instructions for 20 + N requests − instructions for 20) / N, all of the process (client,
# server and layer share one thread). Needs valgrind; the Redis rows need Redis at REDIS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-2000}
variants=${VARIANTS:-bare memory floor redis}
bin=$(scripts/bench-bin.sh server --features redis)
count() {
    SERVER_ONLY="$1:$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for variant in $variants; do
    zero=$(count "$variant" 0)
    many=$(count "$variant" "$n")
    per[$variant]=$(((many - zero) / n))
    echo "instr $variant ${per[$variant]}"
done
ratio() { python3 -c "print('instr $1/$2 %.3f' % (${per[$1]} / ${per[$2]}))"; }
[[ -n ${per[memory]:-} && -n ${per[bare]:-} ]] && ratio memory bare
[[ -n ${per[redis]:-} && -n ${per[floor]:-} ]] && ratio redis floor
true
