#!/bin/bash
# The device check of issue 15: one script for a lent GPU machine (one GPU, no network,
# nothing installed: python3 already holds a CUDA torch, pytest and nvidia-ml-py).
# Steps, each bounded by `timeout` (the bounds add up to 520 s, the figures table's 30 s included):
#   env     the machine: nvidia-smi, torch and CUDA versions, whether torch sees a GPU
#   names   every NVML name agent.py and train_ddp.py use exists in the installed pynvml
#   captures provision's GPU fact commands run and timed, with nvidia-smi -q -x, /dev/nvidia*
#           and the driver's /proc files, into $OUT/captures (fixtures; the load XML is taken
#           10 s into the burn)
#   quick   `agent.py run --mode quick --only gpu` (its JSON lines), timed
#   judge   the real judge on that output: every finding, then the verdict
#   sweep   a bf16 GEMM mini-sweep on gpu0, against quick mode's best
#   burn    a 20 s sustained bf16 burn on gpu0 with NVML telemetry
#   pytest  pytest -m gpu tests/gpu
#   train   the reference trainer, `gpt2` preset, bf16 + torch.compile, 30 steps: MFU
# Last, a table of figure, value, target and OK/MISS; exit 1 on any miss. Without a CUDA
# GPU it stops after `env`, says so, and still prints the table (every figure a MISS).
# Files go to $OUT (default /tmp/gpu-check). Run: device run "bash benchmarks/gpu_check.sh".
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PROVISION_GPU_CHECK=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
STEPS="$OUT/steps.txt"
: > "$STEPS"

# step NAME SECONDS COMMAND...: run it under timeout, output to $OUT/NAME.log and the
# terminal, exit code to steps.txt; 124 means it ran past its bound.
step() {
    local name=$1 seconds=$2 rc
    shift 2
    echo "== $name (at most ${seconds} s): $*"
    timeout --kill-after=5 "$seconds" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    cat "$OUT/$name.log"
    [ "$rc" = 124 ] && echo "$name: timed out after ${seconds} s"
    echo "$name $rc" >> "$STEPS"
    return "$rc"
}

table() {
    "$PY" - "$STEPS" "$OUT/steps.json" <<'EOF'
import json, sys
steps = dict(line.split() for line in open(sys.argv[1]) if line.strip())
json.dump({k: int(v) for k, v in steps.items()}, open(sys.argv[2], "w"))
EOF
    echo "== figures"
    timeout 30 "$PY" benchmarks/gpu_figures.py table "$OUT" | tee "$OUT/figures.txt"
    exit "${PIPESTATUS[0]}"
}

step env 10 nvidia-smi
step torch 30 "$PY" -c '
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
if not torch.cuda.is_available():
    raise SystemExit("no CUDA GPU: torch.cuda.is_available() is False (CPU-only torch, no driver, or no GPU)")
print(torch.cuda.device_count(), "GPU(s):", torch.cuda.get_device_name(0))
'
if [ "$?" != 0 ]; then
    echo "device check stopped: this machine has no usable CUDA GPU (see above); every figure is a MISS"
    table
fi

# The project's own name test when it is there, against this machine's nvidia-ml-py (its
# version is the image's, not the nodes' pin: that one check is left out here); the
# figure comes from the script either way.
if [ -f tests/unit/test_nvml_names.py ]; then
    step names-test 10 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_nvml_names.py -k "not pinned_to"
fi
step names 10 "$PY" benchmarks/gpu_figures.py names "$OUT"
step captures 40 "$PY" benchmarks/gpu_figures.py captures "$OUT"

start=$(date +%s.%N)
step quick 110 "$PY" provision/validate/agent.py run --mode quick --only gpu --data-dir /tmp
"$PY" -c 'import json, sys; json.dump({"seconds": float(sys.argv[2]) - float(sys.argv[1])}, open(sys.argv[3], "w"))' \
    "$start" "$(date +%s.%N)" "$OUT/agent-quick.time.json"
cp "$OUT/quick.log" "$OUT/agent-quick.jsonl"
step judge 20 "$PY" benchmarks/gpu_figures.py judge "$OUT"

step sweep 40 "$PY" benchmarks/gpu_figures.py sweep "$OUT"
(sleep 10; timeout 15 nvidia-smi -q -x > "$OUT/captures/nvidia-smi-q-x_load.xml" 2>&1) &
step burn 30 "$PY" benchmarks/gpu_figures.py burn "$OUT"
wait
step pytest 100 "$PY" -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu

mkdir -p /tmp/gpu-check-train
# MFU with torch.compile: its first steps compile; the summary's rate leaves the warm-up out.
step train 90 "$PY" training/train_ddp.py --model gpt2 --steps 30 --global-batch 32 --micro-batch 32 \
    --compile --data-max-mb 8 --eval-interval 30 --eval-samples 32 --ckpt-dir /tmp/gpu-check-train \
    --data-cache /tmp/gpu-check-train/data --summary "$OUT/train-summary.json"

table
