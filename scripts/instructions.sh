#!/usr/bin/env bash
# Instructions per request for each variant of benches/overhead/, counted by callgrind:
# (instructions for N requests − instructions for 0) / N. Deterministic, unlike wall time on a
# shared machine. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
bin=$(scripts/bench-bin.sh overhead)
count() {
    OVERHEAD_ONLY="$1:$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
declare -A per
for variant in bare tower_retry floor layer layer_post layer_no_budget layer_tps \
    stream_put full_put bare_stream_put bare_full_put; do
    zero=$(count "$variant" 0)
    many=$(count "$variant" "$n")
    per[$variant]=$(((many - zero) / n))
    echo "instr $variant ${per[$variant]}"
done
ratio() { python3 -c "print('instr $1/$2 %.3f' % (${per[$1]} / ${per[$2]}))"; }
ratio layer tower_retry
ratio floor tower_retry
ratio layer floor
ratio layer layer_no_budget
ratio layer_tps layer_no_budget
ratio stream_put full_put
ratio bare_stream_put bare_full_put
# The recording's own cost: a stream over `Full` through the layer, over the same without it.
python3 -c "print('instr recording_overhead %.3f' % ((${per[stream_put]} / ${per[full_put]}) / (${per[bare_stream_put]} / ${per[bare_full_put]})))"

# Deadlines across hops: a GET that reads an inbound deadline and hands its own on, against the
# same GET with a deadline of its own only (goal: at most 1 % more); and the default policy
# (which reads the task-local) against one that inherits nothing.
for variant in deadline_own deadline_carried deadline_off deadline_sent header_none header_floor; do
    zero=$(count "$variant" 0)
    many=$(count "$variant" "$n")
    per[$variant]=$(((many - zero) / n))
    echo "instr $variant ${per[$variant]}"
done
ratio deadline_carried deadline_own
ratio layer deadline_off
# Handing the deadline on: inserting two headers is the floor any client that sends one pays
# (`header_floor` − `header_none`); this crate's own share is what sending costs beyond that
# (finding and matching the host, building the values): goal at most half the floor.
floor=$((per[header_floor] - per[header_none]))
own=$((per[deadline_sent] - per[deadline_own] - floor))
echo "count deadline_header_floor $floor"
echo "count deadline_own_share $own"
python3 -c "print('instr deadline_own_share/header_floor %.3f' % ($own / $floor))"

# The metrics' own cost (feature opentelemetry): a GET through a layer recording in an SDK
# meter, the same without a meter, and the SDK's own histogram record with the same
# attributes built once (`otel_floor`). This crate's share is what the meter adds beyond the
# SDK's record; the goal is at most half of that record.
bin=$(scripts/bench-bin.sh overhead --features opentelemetry)
for variant in layer layer_metrics otel_floor; do
    zero=$(count "$variant" 0)
    many=$(count "$variant" "$n")
    per[m_$variant]=$(((many - zero) / n))
    echo "instr metrics/$variant ${per[m_$variant]}"
done
python3 -c "print('instr layer_metrics/layer %.3f' % (${per[m_layer_metrics]} / ${per[m_layer]}))"
own=$((per[m_layer_metrics] - per[m_layer] - per[m_otel_floor]))
echo "count metrics_own_share $own"
python3 -c "print('instr metrics_own_share/otel_floor %.3f' % ($own / ${per[m_otel_floor]}))"
