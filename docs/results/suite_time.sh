#!/usr/bin/env bash
# The test suite's parallel part timed, with the machine's CPU use sampled beside it
# (docs/benchmarks.md, session 36). Run from a clone with its venv (`make install`):
#   bash docs/results/suite_time.sh [N]      N: xdist workers (default 2, as `make test`)
# Prints pytest's summary and the mean busy share of all cores from /proc/stat.
set -u
cd "$(dirname "$0")/../.."
n=${1:-2}
log=$(mktemp)
(
    read -r _ a b c d e f g h _ < /proc/stat
    prev_total=$((a + b + c + d + e + f + g + h)) prev_idle=$((d + e))
    while sleep 10; do
        read -r _ a b c d e f g h _ < /proc/stat
        total=$((a + b + c + d + e + f + g + h)) idle=$((d + e))
        echo $((100 * (total - prev_total - idle + prev_idle) / (total - prev_total)))
        prev_total=$total prev_idle=$idle
    done
) > "$log" &
sampler=$!
.venv/bin/python -m pytest -m "not gpu and not alone" -q -n "$n" --dist loadfile \
    --no-loadscope-reorder --durations=40 -p no:cacheprovider | tail -45
kill "$sampler"
awk '{s += $1; k++} END {if (k) printf "cpu busy: %.0f%% mean over %d samples of 10 s\n", s / k, k}' "$log"
rm -f "$log"
