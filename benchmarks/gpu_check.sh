#!/bin/sh
# Every GPU check and figure in one call, for a lent GPU machine (`device` run), where
# python3 already holds a CUDA torch, pytest and nvidia-ml-py (pyinfra/fabric are not
# needed: the agent and the trainer run standalone on nodes). Writes into $OUT:
#   nvidia-smi.txt  the machine, driver and clocks
#   pytest.log      tests/gpu (agent GEMM/HBM/PCIe/burn on every GPU; trainer bf16, MFU,
#                   torch.compile, NCCL) with the figures they print
#   agent-full.json the validate agent in --full mode (GPU group): every GPU figure
#   agent-quick.*   the agent in --mode quick (GPU group) and its wall time
#   train.log       the reference trainer, model gpt2-ish 'medium', bf16, torch.compile: tokens/s, MFU
#   figures.txt     every figure against its target (benchmarks/gpu_figures.py)
# Each part is bounded by `timeout`, so the whole script ends inside one 10-minute call.
# Run: device run, command "sh benchmarks/gpu_check.sh", timeout_s 560.
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" \
    >> "$OUT/nvidia-smi.txt" 2>&1

timeout 240 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu > "$OUT/pytest.log" 2>&1
echo "pytest exit $?" >> "$OUT/pytest.log"

# Quick mode's GPU part, timed (target <= 60 s), then the full shape sweep to compare with.
start=$(date +%s.%N)
timeout 120 python3 -m provision.validate.agent run --mode quick --only gpu \
    > "$OUT/agent-quick.json" 2> "$OUT/agent-quick.err"
echo "agent exit $?" >> "$OUT/agent-quick.err"
python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)" \
    > "$OUT/agent-quick.seconds"

timeout 150 python3 -m provision.validate.agent run --mode full --only gpu,allreduce \
    > "$OUT/agent-full.json" 2> "$OUT/agent-full.err"
echo "agent exit $?" >> "$OUT/agent-full.err"

mkdir -p /tmp/gpu-train
# The MFU figure is with torch.compile (its first steps compile; the summary's rate
# leaves the warm-up out).
timeout 150 python3 training/train_ddp.py --model medium --steps 60 --global-batch 64 --micro-batch 32 \
    --compile --data-max-mb 8 --eval-interval 30 --eval-samples 64 --ckpt-dir /tmp/gpu-train \
    --data-cache /tmp/gpu-train/data --summary "$OUT/train-summary.json" > "$OUT/train.log" 2>&1
echo "train exit $?" >> "$OUT/train.log"

python3 benchmarks/gpu_figures.py "$OUT" | tee "$OUT/figures.txt"
