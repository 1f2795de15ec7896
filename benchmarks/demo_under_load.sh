#!/bin/bash
# The demo from a fresh clone on a busy machine (issue 14): N CPU-bound busy loops beside
# `./scripts/demo`, the load average sampled every 30 s, and the demo's exit code and wall
# time at the end. Every figure is bounded: the loops stop with the demo or after CAP_S.
# Run (as root, from anywhere): benchmarks/demo_under_load.sh CLONE_DIR CACHE_DIR [N] [CAP_S]
#   CLONE_DIR: where to clone this checkout's HEAD (must not exist)
#   CACHE_DIR: XDG_CACHE_HOME for the demo (an empty dir = a fresh machine)
set -u
SRC=$(cd "$(dirname "$0")/.." && pwd)
CLONE=${1:?clone dir}; CACHE=${2:?cache dir}; N=${3:-4}; CAP_S=${4:-7200}
git clone -q "$SRC" "$CLONE" || exit 2
mkdir -p "$CACHE"
LOG="$CLONE.loadavg"
pids=()
for _ in $(seq "$N"); do
  timeout "$CAP_S" sh -c 'while :; do :; done' & pids+=($!)
done
( while :; do echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done ) > "$LOG" & sampler=$!
start=$(date +%s)
( cd "$CLONE" && XDG_CACHE_HOME="$CACHE" timeout "$CAP_S" ./scripts/demo )
rc=$?
end=$(date +%s)
kill "${pids[@]}" "$sampler" 2>/dev/null
wait 2>/dev/null
# the mean of the 1-minute load average over the samples taken while the demo ran
mean=$(awk '{s += $2; n++} END {if (n) printf "%.1f", s / n}' "$LOG")
min=$(awk 'NR == 1 || $2 < m {m = $2} END {print m}' "$LOG")
echo "demo under load: exit $rc, $((end - start)) s wall, $N busy loops beside it," \
     "1-min load average mean $mean (min $min) over $(wc -l < "$LOG") samples in $LOG"
exit "$rc"
