#!/bin/bash
# Soak test for the trainer's shutdown: N runs of two single-process "nodes" (two torchrun
# agents, c10d rendezvous on loopback), counting runs in which a rank died by SIGABRT after
# finishing ("terminate called without an active exception"). This is how the DDP wrapper
# holding the gloo group past destroy_process_group was found; keep it at 0.
# Run: benchmarks/train_exit_soak.sh [N]   (about 6 s a run on 2 idle cores)
set -u
N=${1:-12}
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
bad=0
for i in $(seq "$N"); do
  port=$((29700 + i))
  for r in 0 1; do
    OMP_NUM_THREADS=1 timeout 120 "$HERE/.venv/bin/python" -m torch.distributed.run --nnodes 2 --nproc-per-node 1 \
      --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "soak$i" "$HERE/training/train_ddp.py" \
      --steps 4 --data-max-mb 1 --eval-interval 3 --eval-samples 8 --ckpt-dir "$WORK/ck$i-$r" \
      --data-cache "$WORK/data" > "$WORK/run$i-$r.log" 2>&1 &
  done
  wait
  if grep -q "SIGABRT\|terminate called" "$WORK/run$i-0.log" "$WORK/run$i-1.log"; then
    bad=$((bad + 1)); echo "run $i: a rank aborted (logs in $WORK)"
  fi
done
echo "aborted runs: $bad of $N"
[ "$bad" -eq 0 ] && rm -rf "$WORK"
[ "$bad" -eq 0 ]
