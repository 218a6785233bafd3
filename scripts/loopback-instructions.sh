#!/usr/bin/env bash
# Instructions per request for rows of benches/loopback.rs, counted by callgrind: (instructions
# for 20 + N requests − instructions for 20) / N, all of the process (hyper-util's client, the
# layer and the hyper server share one thread; the kernel's copies are not counted). Close to
# deterministic: the sizes that reads return can vary a little from run to run. Needs valgrind.
# ROWS picks the rows (default: every row).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200}
rows=${ROWS:-bare layer tower_retry reqwest_mw_layer reqwest_retry layer_16k read_whole_16k layer_1m read_whole_1m}
bin=$(scripts/bench-bin.sh loopback --features reqwest-middleware)
count() {
    LOOPBACK_ONLY="$1:$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for row in $rows; do
    zero=$(count "$row" 0)
    many=$(count "$row" "$n")
    per[$row]=$(((many - zero) / n))
    echo "instr loopback_$row ${per[$row]}"
done
ratio() { python3 -c "print('instr loopback_$1/loopback_$2 %.3f' % (${per[$1]} / ${per[$2]}))"; }
[[ -n ${per[read_whole_16k]:-} && -n ${per[layer_16k]:-} ]] && ratio read_whole_16k layer_16k
[[ -n ${per[read_whole_1m]:-} && -n ${per[layer_1m]:-} ]] && ratio read_whole_1m layer_1m
[[ -n ${per[layer]:-} && -n ${per[bare]:-} ]] && ratio layer bare
[[ -n ${per[layer]:-} && -n ${per[tower_retry]:-} ]] && ratio layer tower_retry
[[ -n ${per[tower_retry]:-} && -n ${per[bare]:-} ]] && ratio tower_retry bare
[[ -n ${per[reqwest_mw_layer]:-} && -n ${per[reqwest_retry]:-} ]] && ratio reqwest_mw_layer reqwest_retry
true
