#!/bin/sh
# Every GPU check and figure in one call, for a lent GPU machine (`device` run), where
# python3 already holds a CUDA torch, pytest and nvidia-ml-py (pyinfra/fabric are not
# needed: the agent and the trainer run standalone on nodes). Writes into $OUT:
#   nvidia-smi.txt  the machine, driver and clocks
#   pytest.log      tests/gpu (agent GEMM/HBM/PCIe/burn on every GPU; trainer bf16, MFU,
#                   torch.compile, NCCL) with the figures they print
#   agent-full.json the validate agent in --full mode (GPU group): every GPU figure
#   train.log       the reference trainer, model gpt2-ish 'medium', bf16: tokens/s and MFU
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

timeout 150 python3 -m provision.validate.agent run --mode full --only gpu,allreduce \
    > "$OUT/agent-full.json" 2> "$OUT/agent-full.err"
echo "agent exit $?" >> "$OUT/agent-full.err"

mkdir -p /tmp/gpu-train
timeout 120 python3 training/train_ddp.py --model medium --steps 60 --global-batch 64 --micro-batch 32 \
    --data-max-mb 8 --eval-interval 30 --eval-samples 64 --ckpt-dir /tmp/gpu-train \
    --data-cache /tmp/gpu-train/data --summary "$OUT/train-summary.json" > "$OUT/train.log" 2>&1
echo "train exit $?" >> "$OUT/train.log"
