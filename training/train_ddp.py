"""The reference DDP trainer: a small GPT on byte-level text, one readable file.

It proves that a cluster trains together: every rank computes on its share of each global
batch, DDP averages the gradients over the network (NCCL on GPUs, gloo on CPUs), and
rank 0 reports loss, throughput and (on GPUs) MFU. With no flags it runs a tiny model for
a few seconds on a CPU, which is its own smoke test.

Data needs no download: by default the Python standard library's own source files on the
node (``sysconfig``'s stdlib path), read as bytes (vocabulary 256). ``--data DIR`` takes
any directory of text files. The prepare step writes ``train.bin``/``val.bin`` (uint8
memmaps) once, to ``/shared/datasets`` when that NFS share is writable, else ``./data``
(``--data-cache`` chooses; ``provision train`` passes the share from the settings).

Batch: the global batch (16 sequences by default) is split over the ranks, and each rank
runs it in micro-batches with gradient accumulation. The defaults fit any world size: the
micro-batch shrinks to fit a rank's share, and a world larger than the global batch, or
one that does not divide it, rounds the default up to a multiple of the ranks (a line says
so). An explicit ``--global-batch`` is kept on any world size: ranks then take shares that
differ by one sequence, and each sequence's loss is weighted so the gradient is the
batch's mean all the same.

Launch commands (``provision train`` builds the multi-node one for you):

  one process:      python training/train_ddp.py
  one node, 8 GPUs: torchrun --standalone --nproc-per-node 8 training/train_ddp.py --model gpt2
  several nodes (run on every node; ADDR is the first node's cluster address):
      NCCL_SOCKET_IFNAME=eth1 GLOO_SOCKET_IFNAME=eth1 \\
      torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
          --rdzv-endpoint ADDR:29500 --rdzv-id myrun42 training/train_ddp.py --model gpt2

Resume: add ``--resume``; the run continues from the newest good checkpoint's step with the
same data order, learning rate and optimizer state, so its losses match an uninterrupted
run, also on another number of ranks: the global batch is the checkpoint's, and every
sequence of it counts the same however it splits over the ranks. ``--auto-resume`` does
the same when a checkpoint exists and starts at step 0 when none does (for restarts);
``--auto-resume-own`` likewise, from a checkpoint this ``--run-id`` wrote only (a requeued
Slurm job's restart, which must not continue an earlier run's checkpoint of the same name).
Checkpoints are ``<ckpt-dir>/<ckpt-name>-step<N>.pt``, written atomically; the newest two
are kept, and a torn one is skipped with a note.

Stragglers: ``--drop-stragglers F`` names, after a checkpoint, a node whose own step time
(its step less its wait at the gradient all-reduce) was over F times the other nodes'
median over the last ``--straggler-window`` steps
(``straggler: dropping NODE: ...``); ``provision train --min-nodes K --drop-stragglers F``
then takes that node out and the others resume from that checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# ----------------------------------------------------------------------------------------
# Hyperparameters. Every one is a command-line flag (--steps, --global-batch, ...).
MODEL = "tiny"  # size preset, see MODEL_SIZES; --n-layer etc. override single fields
STEPS = 20  # optimizer steps to run (the total, counted from step 0 also on --resume)
GLOBAL_BATCH = 16  # sequences per optimizer step over all ranks; rounded up to a multiple of the ranks
CKPT_KEEP = 2  # checkpoints kept: the newest, and one before it should the newest be torn
MICRO_BATCH = 8  # most sequences per forward pass on one rank; the rest is gradient accumulation
LEARNING_RATE = 1e-3  # peak AdamW learning rate
MIN_LR_FRACTION = 0.1  # cosine decay ends at this fraction of the peak
WARMUP_STEPS = 5  # linear warmup from 0 to the peak
LR_DECAY_STEPS = 0  # cosine length in steps; 0 means "the same as --steps"
WEIGHT_DECAY = 0.1  # AdamW weight decay on matrices (not on biases and norms)
GRAD_CLIP = 1.0  # clip the global gradient norm to this; 0 disables
DROPOUT = 0.0  # dropout probability; 0 keeps runs bit-reproducible on CPU
SEED = 1337  # model init, data order and dropout all derive from it
EVAL_INTERVAL = 10  # evaluate on the validation split every this many steps (and at the end)
EVAL_SAMPLES = 32  # validation sequences per evaluation, split over the ranks
LOG_INTERVAL = 1  # print a train line every this many steps
CKPT_INTERVAL = 0  # save a checkpoint every this many steps; 0: only at the end
STRAGGLER_WINDOW = 20  # --drop-stragglers: steps a node must stay slow before it is named
DATA_MAX_MB = 4  # read at most this much text when preparing the token file
VAL_FRACTION = 0.1  # the tail of the text held out for validation

# name: (n_layer, n_head, n_embd, block_size)
MODEL_SIZES = {
    "tiny": (2, 2, 64, 64),  # ~0.1M params: seconds on one CPU core
    "small": (4, 4, 128, 128),  # ~0.8M params: the CPU scaling benchmark
    # ~11M params: nanoGPT's shakespeare-char size. Too small to keep a datacenter GPU's
    # tensor cores busy (its MFU stays far below the 0.45 target): measure MFU on gpt2.
    "medium": (6, 6, 384, 256),
    # GPT-2 small's shape (12 layers, 768 wide, 1024 context): ~85M params here, because
    # GPT-2's 124M count includes a 50k-token embedding this byte-level trainer does not
    # need. The preset for MFU (benchmarks/gpu_check.sh runs it compiled, 30 steps).
    "gpt2": (12, 12, 768, 1024),
}
SHARED = Path("/shared")  # NFS mount root (setting nfs_mount_root): checkpoints/ and datasets/
# Dense bf16 peak TFLOP/s per GPU, for MFU, by a lower-case fragment of the NVML product
# name; the longest fragment found wins, so "NVIDIA H100 PCIe" is not taken for an SXM
# H100. The same figures as GPU_SPECS in provision/validate/expectations.py (a unit test
# holds them equal; this file runs on nodes without the provision package). A GPU not
# listed gets no MFU: pass --peak-tflops.
PEAK_TFLOPS = {
    "a100-sxm4-40gb": 312.0,
    "a100-sxm4-80gb": 312.0,
    "a100-sxm-80gb": 312.0,
    "a100-pcie-40gb": 312.0,
    "a100 80gb pcie": 312.0,
    "a100-pcie-80gb": 312.0,
    "h100 80gb hbm3": 989.5,
    "h100-sxm": 989.5,
    "h100 pcie": 756.5,
    "h100 nvl": 835.5,
    "h200": 989.5,
    "h200 nvl": 835.5,
    "gh200": 989.5,
    "gh200 144g": 989.5,
    "l40s": 362.05,
    "b200": 2250.0,
}
# ----------------------------------------------------------------------------------------


@dataclass
class GPTConfig:
    n_layer: int  # transformer blocks
    n_head: int  # attention heads per block
    n_embd: int  # embedding width
    block_size: int  # context length in bytes
    vocab_size: int = 256  # byte-level tokens
    dropout: float = 0.0  # dropout probability


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N for the matmuls plus attention (PaLM appendix B)."""
        n = sum(p.numel() for p in self.parameters())
        c = self.cfg
        return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size


# ---------------------------------------------------------------- distributed setup


@dataclass
class Dist:
    rank: int  # global rank
    local_rank: int  # rank on this node
    world: int  # number of ranks
    device: torch.device  # cuda:LOCAL_RANK or cpu
    node: str  # node name for reports (PROVISION_NODE, else the host name)


def setup_distributed() -> Dist:
    """Initialise from torchrun's environment (RANK, WORLD_SIZE, ...); one process without it."""
    _die_with_parent()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    node = os.environ.get("PROVISION_NODE") or socket.gethostname()
    return Dist(rank, local_rank, world, device, node)


def _die_with_parent() -> None:
    """If torchrun is killed outright, take this worker with it (Linux PR_SET_PDEATHSIG):
    a worker must never outlive its launcher."""
    if sys.platform.startswith("linux") and "RANK" in os.environ:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def barrier(d: Dist) -> None:
    if d.world > 1:
        dist.barrier()


def all_mean(d: Dist, value: torch.Tensor) -> float:
    """Mean of a scalar tensor over all ranks, read on the host (a sync: once per step)."""
    t = value.detach().to(torch.float64).reshape(1).clone()
    if d.world > 1:
        dist.all_reduce(t)
    return (t / d.world).item()


# ---------------------------------------------------------------- data


def _writable(path: Path) -> bool:
    """A directory this user may write (over NFS, access() asks the server: root_squash)."""
    return path.is_dir() and os.access(path, os.W_OK)


def shared_or_local(d: Dist, share: str, local: Path, flag: str) -> Path | None:
    """SHARED/share when this user may write it, else None after saying so: files on a
    node's own disk are not seen by the other nodes (nor by a resume on another node)."""
    if _writable(SHARED / share):
        return SHARED / share
    log(
        d,
        f"note: {SHARED / share} is not writable here; using {local.resolve()} on this node's "
        f"local disk instead (pass {flag} DIR to choose)",
    )
    return None


def default_data_cache(d: Dist) -> Path:
    shared = shared_or_local(d, "datasets", Path("data"), "--data-cache")
    return shared / "train_ddp" if shared else Path("data")


def text_files(src: Path) -> list[Path]:
    """Every text file under src, in a stable order (NUL bytes mean binary: skipped)."""
    files = []
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        if "site-packages" in path.parts or "__pycache__" in path.parts:
            continue
        with open(path, "rb") as f:
            if b"\0" not in f.read(8192):
                files.append(path)
    return files


def prepare_tokens(src: Path, out: Path, max_bytes: int, val_fraction: float) -> dict:
    """Write out/train.bin and out/val.bin (uint8 bytes) and out/meta.json; atomic per file."""
    chunks, total = [], 0
    for path in text_files(src):
        data = path.read_bytes()[: max_bytes - total]
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    tokens = np.frombuffer(b"\n".join(chunks), dtype=np.uint8)
    if len(tokens) < 10_000:
        raise SystemExit(f"{src}: only {len(tokens)} bytes of text; need at least 10000")
    split = int(len(tokens) * (1 - val_fraction))
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.bin", tokens[:split]), ("val.bin", tokens[split:])):
        _atomic_write(out / name, part.tobytes())
    meta = {
        "source": str(src),
        "train_tokens": split,
        "val_tokens": len(tokens) - split,
        "sha1": hashlib.sha1(tokens.tobytes()).hexdigest(),
    }
    _atomic_write(out / "meta.json", json.dumps(meta).encode())
    return meta


def _atomic_write(path: Path, data: bytes) -> None:
    """Write tmp, fsync, rename: a reader sees the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_tokens(d: Dist, args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Prepare once (global rank 0, then each node's local rank 0 if its disk lacks the
    files, i.e. no shared directory), then memmap on every rank."""
    src = Path(args.data or sysconfig.get_paths()["stdlib"])
    key = hashlib.sha1(f"{src.resolve()}|{args.data_max_mb}|{args.val_fraction}".encode()).hexdigest()
    out = Path(args.data_cache or default_data_cache(d)) / key[:12]
    for writer in (d.rank == 0, d.local_rank == 0):
        if writer and not (out / "meta.json").exists():
            prepare_tokens(src, out, args.data_max_mb << 20, args.val_fraction)
        barrier(d)
    meta = json.loads((out / "meta.json").read_text())
    _same_everywhere(d, meta["sha1"])
    log(d, f"data {meta['source']}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val bytes")
    read = lambda name: np.memmap(out / name, dtype=np.uint8, mode="r")  # noqa: E731
    return read("train.bin"), read("val.bin")


def _same_everywhere(d: Dist, digest: str) -> None:
    if d.world > 1:
        digests: list[str | None] = [None] * d.world
        dist.all_gather_object(digests, digest)
        if len(set(digests)) > 1:
            raise SystemExit(f"ranks read different data {set(digests)}; use --data on a shared dir")


def batch(tokens: np.ndarray, starts: list[int], T: int, device: torch.device):
    """Inputs and next-byte targets for sequences starting at the given block indices."""
    rows = np.stack([tokens[i * T : i * T + T + 1] for i in starts]).astype(np.int64)
    t = torch.from_numpy(rows).to(device, non_blocking=True)
    return t[:, :-1], t[:, 1:]


class StepSampler:
    """This rank's sequence indices for a given step.

    A step's global batch depends only on (seed, step, global batch): each epoch is a
    permutation of the training sequences, cut into global batches, and rank r of W takes
    every W-th sequence of the step's batch (shares differ by one at most when W does not
    divide it). So a resumed run reads exactly what an uninterrupted one would have read,
    on the same number of ranks or another.
    """

    def __init__(self, d: Dist, n_blocks: int, global_batch: int, seed: int):
        self.rank, self.world, self.n_blocks = d.rank, d.world, n_blocks
        self.global_batch, self.seed = global_batch, seed
        self.epoch, self.order = -1, []
        self.steps_per_epoch = n_blocks // global_batch
        if self.steps_per_epoch == 0:
            raise SystemExit(f"{n_blocks} training sequences: too few for a global batch of {global_batch}")

    def global_indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch != self.epoch:
            g = torch.Generator().manual_seed(self.seed + epoch)
            self.order, self.epoch = torch.randperm(self.n_blocks, generator=g).tolist(), epoch
        return self.order[k * self.global_batch : (k + 1) * self.global_batch]

    def indices(self, step: int) -> list[int]:
        return self.global_indices(step)[self.rank :: self.world]


def micro_batches(share: int, micro_batch: int, world: int, global_batch: int) -> list[tuple[int, int, float]]:
    """(start, end, weight) of each micro-batch of a rank's ``share`` sequences: the rank
    backpropagates the micro-batch's mean loss times ``weight`` = its size x world /
    global batch. DDP averages the ranks' gradients (divides by the world), so every
    sequence of the global batch counts 1/global batch, however many ranks there are and
    however unevenly the batch splits over them."""
    return [
        (lo, min(lo + micro_batch, share), (min(lo + micro_batch, share) - lo) * world / global_batch)
        for lo in range(0, share, micro_batch)
    ]


# ---------------------------------------------------------------- training


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup, then cosine decay to MIN_LR_FRACTION of the peak."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    decay = args.lr_decay_steps or args.steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, decay - args.warmup_steps))
    floor = args.lr * MIN_LR_FRACTION
    return floor + 0.5 * (args.lr - floor) * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Fused AdamW on GPUs: one kernel for every parameter instead of a few per tensor, which
    # is several ms a step for a model this small. CPUs keep the default (the DDP test
    # compares their fp32 results exactly).
    on_gpu = any(p.is_cuda for p in model.parameters())
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=on_gpu or None)


def autocast(d: Dist):
    """bf16 autocast on GPUs; plain fp32 on CPUs (exact, and what the DDP test compares)."""
    if d.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(d: Dist, model: nn.Module, val: np.ndarray, cfg: GPTConfig, args) -> float:
    """Mean loss over a fixed set of validation sequences, summed over ranks then divided:
    the same number whatever the world size."""
    model.eval()
    n_blocks = (len(val) - 1) // cfg.block_size
    fixed = np.linspace(0, n_blocks - 1, min(args.eval_samples, n_blocks)).astype(int).tolist()
    mine, total = fixed[d.rank :: d.world], torch.zeros(2, dtype=torch.float64, device=d.device)
    for i in range(0, len(mine), args.micro_batch):
        x, y = batch(val, mine[i : i + args.micro_batch], cfg.block_size, d.device)
        with autocast(d):
            total[0] += model(x, y, reduction="sum").double()
        total[1] += y.numel()
    if d.world > 1:
        dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


class StepTimer:
    """Where one rank's time goes within a step, on the clock of the device doing the work:
    CUDA events on a GPU (perf_counter around asynchronous kernels times their launch, not
    the kernels), perf_counter on a CPU. Read it after the step's synchronize.

    Marks: each forward pass (the straggler signal), "ready" when a backward pass has
    computed all of this rank's gradients, and "synced" when the last backward returned,
    i.e. the gradient all-reduce is done. Between the two the rank waits for slower ranks.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.grad_norm = None  # the step's gradient norm before clipping, set by train_step
        self.reset()

    def reset(self) -> None:
        self.forwards: list[tuple] = []  # (start, end) of each forward pass of the step
        self.ready = self.synced = None  # gradients computed here / all-reduced everywhere

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @contextlib.contextmanager
    def forward(self):
        start = self.now()
        yield
        self.forwards.append((start, self.now()))

    def watch(self, model: nn.Module) -> None:
        """Mark "ready" whenever a backward pass has every gradient of the model (a hook
        that runs before the last gradient bucket's all-reduce can start)."""
        params = [p for p in model.parameters() if p.requires_grad]
        torch.autograd.graph.register_multi_grad_hook(params, self._mark_ready)

    def _mark_ready(self, grads) -> None:
        self.ready = self.now()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def forward_s(self) -> float:
        return sum(self.seconds(a, b) for a, b in self.forwards)

    def wait_s(self) -> float:
        """Gradients ready here -> all-reduced: the wait for slower ranks, plus whatever
        of the all-reduce the backward pass did not hide."""
        if self.ready is None or self.synced is None:
            return 0.0
        return max(0.0, self.seconds(self.ready, self.synced))


class StragglerWatch:
    """--drop-stragglers F: names a node whose own step time stayed above F times the
    median of the other nodes' over the last ``window`` steps: the median of its per-step
    ratios is above F, so one noisy step neither makes nor breaks it. Its own step time is
    its ranks' step less what they waited at the gradient all-reduce (the StepTimer's
    split, as in own_rate): every rank's step lasts as long as the slowest one's, and the
    wait is where the others pay for the slow one. Measured, a node stopped three quarters
    of the time showed 3.7x on its own time; on forward time alone the fast node looked
    slower (it waited there, 3.7x), so forward time cannot pick the node. Against the other
    nodes, not all of them: with two nodes the median of both is their mean, which a slow
    node can never exceed twice. Rank 0 names it after the next checkpoint ("straggler:
    dropping NODE"), and `provision train --drop-stragglers` takes the node out of an
    elastic run there, so the others resume from that checkpoint at their own pace. One
    all_gather of a scalar per step, only with the flag."""

    def __init__(self, d: Dist, factor: float, window: int):
        self.d, self.factor, self.window = d, factor, window
        names: list[object] = [None] * d.world
        if d.world > 1:
            dist.all_gather_object(names, d.node)
        else:
            names = [d.node]
        self.rank_node = [str(n) for n in names]
        self.history: list[dict[str, float]] = []  # per step: node -> its ranks' mean own time

    def observe(self, own_s: float) -> None:
        t = torch.tensor([own_s], dtype=torch.float64, device=self.d.device)
        every = [torch.zeros_like(t) for _ in range(self.d.world)]
        if self.d.world > 1:
            dist.all_gather(every, t)
        else:
            every = [t]
        by_node: dict[str, list[float]] = {}
        for rank, value in enumerate(every):
            by_node.setdefault(self.rank_node[rank], []).append(value.item())
        self.history = [*self.history, {n: sum(v) / len(v) for n, v in by_node.items()}][-self.window :]

    def slow(self) -> tuple[str, float] | None:
        """(node, its median ratio over the window) for the slowest node above the factor
        over a full window; None while none is."""
        if len(self.history) < self.window or len(self.history[-1]) < 2:
            return None
        worst = None
        for node in self.history[-1]:
            ratios = sorted(step[node] / mid for step in self.history if (mid := _median_of_others(step, node)) > 0)
            ratio = ratios[len(ratios) // 2] if len(ratios) == self.window else 0.0
            if ratio > self.factor and (worst is None or ratio > worst[1]):
                worst = (node, ratio)
        return worst


def _median_of_others(step: dict[str, float], node: str) -> float:
    others = sorted(v for n, v in step.items() if n != node)
    if node not in step or not others:
        return 0.0
    half = len(others) // 2
    return others[half] if len(others) % 2 else (others[half - 1] + others[half]) / 2


def train_step(d, model, opt, sampler, train, cfg, step, args, timer: StepTimer) -> torch.Tensor:
    """One optimizer step over this rank's share of the global batch; gradients are
    all-reduced once, on the last micro-batch (no_sync on the others). Returns the loss as
    a tensor on the device: nothing here waits for the device, the caller reads the loss
    once per step. ``timer`` gets the forward passes and the gradient sync. The loss is this
    rank's weighted share (micro_batches): its mean over the ranks is the batch's mean."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, args)
    torch.manual_seed(args.seed + 1000 * step + d.rank)  # dropout masks follow the step
    idx = sampler.indices(step)
    parts = micro_batches(len(idx), args.micro_batch, d.world, args.global_batch)
    loss_sum = torch.zeros((), dtype=torch.float64, device=d.device)
    timer.reset()
    for k, (lo, hi, weight) in enumerate(parts):
        x, y = batch(train, idx[lo:hi], cfg.block_size, d.device)
        sync = k == len(parts) - 1 or not isinstance(model, DDP)
        with contextlib.nullcontext() if sync else model.no_sync():
            with timer.forward(), autocast(d):
                loss = model(x, y) * weight
            loss.backward()
        loss_sum += loss.detach()
    timer.synced = timer.now()
    # The total gradient norm before clipping (for --tensorboard); no clip: not measured.
    norm = nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip) if args.grad_clip > 0 else None
    opt.step()
    opt.zero_grad(set_to_none=True)
    timer.grad_norm = norm
    return loss_sum


# ---------------------------------------------------------------- checkpoints


def default_ckpt_dir(d: Dist) -> Path:
    return shared_or_local(d, "checkpoints", Path("checkpoints"), "--ckpt-dir") or Path("checkpoints")


def checkpoint_path(directory: Path, name: str, step: int) -> Path:
    return directory / f"{name}-step{step:08d}.pt"


def checkpoint_files(directory: Path, name: str) -> list[tuple[int, Path]]:
    """(step, path) of the run's checkpoints by their names, newest first. A temporary
    file of a save that did not finish starts with a dot and is never among them."""
    found = []
    for path in directory.glob(f"{name}-step*.pt"):
        digits = path.name[len(name) + len("-step") : -len(".pt")]
        if digits.isdigit():
            found.append((int(digits), path))
    return sorted(found, reverse=True)


def save_checkpoint(d: Dist, directory: Path, name: str, model, opt, step: int, cfg: GPTConfig, args) -> Path | None:
    """Rank 0 writes a temporary file, fsyncs it and renames it to the step's name, so a
    crash mid-save leaves the checkpoints before it whole. Then checkpoints of later steps
    are removed (they are an earlier run's: this run started afresh below them, and a
    --resume must continue this one), and only the newest CKPT_KEEP are kept."""
    if d.rank != 0:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, name, step)
    tmp = path.with_name(f".{path.name}.tmp")
    state = {
        "model": _raw(model).state_dict(),
        "opt": opt.state_dict(),
        "step": step,
        "config": asdict(cfg),
        "global_batch": args.global_batch,
        "world": d.world,
        "run_id": args.run_id,  # --auto-resume-own continues only its own run's checkpoints
    }
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    log(d, f"checkpoint step {step} -> {path}")
    found = checkpoint_files(directory, name)
    mine = [p for s, p in found if s <= step]
    stale = [p for s, p in found if s > step] + mine[CKPT_KEEP:]
    for old in stale:
        with contextlib.suppress(OSError):
            old.unlink()
    return path


def newest_good_checkpoint(
    directory: Path, name: str, say=print, run_id: str | None = None
) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads whole and says the step its name says, with its
    state; each one passed over is named with why (a save torn by a crash, a file copied
    in by hand, with ``run_id``: another run's). None when there is none."""
    for step, path in checkpoint_files(directory, name):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torn or foreign: pickle, zip and EOF errors alike
            say(f"note: skipped checkpoint {path}: it does not load ({type(e).__name__}: {e})")
            continue
        if not isinstance(state, dict) or not {"model", "opt", "step", "config"} <= state.keys():
            say(f"note: skipped checkpoint {path}: not a checkpoint of this trainer")
            continue
        if state["step"] != step:
            say(f"note: skipped checkpoint {path}: it holds step {state['step']}, its name says {step}")
            continue
        if run_id is not None and state.get("run_id") != run_id:
            say(f"note: skipped checkpoint {path}: run {state.get('run_id') or 'unknown'}'s, not this run's ({run_id})")
            continue
        return path, state
    return None


def load_checkpoint(
    d: Dist, directory: Path, name: str, cfg: GPTConfig, required: bool, run_id: str | None = None
) -> dict | None:
    """Every rank gets the newest good checkpoint, as rank 0 chose it: read locally where
    that file is visible on every node (shared directory), else broadcast from rank 0.
    None when there is none and ``required`` is False. With ``run_id``, only that run's
    checkpoints count."""
    chosen = newest_good_checkpoint(directory, name, lambda text: log(d, text), run_id) if d.rank == 0 else None
    box: list = [str(chosen[0]) if chosen else None]
    if d.world > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        if required:
            raise SystemExit(f"--resume: no checkpoint at {directory}/{name}-step*.pt")
        return None
    path = Path(box[0])
    here = torch.tensor([path.is_file()], dtype=torch.int64, device=d.device)
    if d.world > 1:
        dist.all_reduce(here, op=dist.ReduceOp.MIN)
    if here.item():
        state = chosen[1] if chosen is not None else torch.load(path, map_location="cpu", weights_only=True)
    else:  # not visible on every node: rank 0's copy for all
        states = [chosen[1] if chosen is not None else None]
        dist.broadcast_object_list(states, src=0)
        state = states[0]
    if state["config"] != asdict(cfg):
        raise SystemExit(f"--resume: {path} holds model {state['config']}, not {asdict(cfg)}")
    state["path"] = str(path)
    return state


def _raw(model: nn.Module) -> nn.Module:
    model = model.module if isinstance(model, DDP) else model
    return getattr(model, "_orig_mod", model)  # torch.compile wraps the module


# ---------------------------------------------------------------- reporting


class Events:
    """--tensorboard: rank 0's TensorBoard event files, written with torch's SummaryWriter
    (the tensorboard package): at every log step the train loss, learning rate, tokens/s,
    MFU, gradient norm and each node's own step time (its step less its wait for the
    others); the validation loss at every evaluation; the run's hyperparameters (HParams,
    with the final losses) at the end. Without the flag, or without the package (a note
    says so), nothing is written and nothing else changes. Every rank takes part in the
    per-node gather, so every rank builds one; only rank 0 writes."""

    def __init__(self, d: Dist, args) -> None:
        self.on = bool(args.tensorboard)
        self.writer = None
        if not self.on or d.rank != 0:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            log(d, f"note: no TensorBoard events: {e} (the frameworks step installs tensorboard)")
            return
        Path(args.tensorboard).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=args.tensorboard, flush_secs=10)
        log(d, f"tensorboard events -> {args.tensorboard}")

    def scalar(self, tag: str, value: float | None, step: int) -> None:
        if self.writer is not None and value is not None and math.isfinite(value):
            self.writer.add_scalar(tag, value, step)

    def step(self, d: Dist, n: int, loss: float, lr: float, tps: float, mfu_scale, dt: float, timer) -> None:
        if not self.on:
            return
        own = [(d.node, dt - timer.wait_s())]
        if d.world > 1:  # every rank's own step time, for the per-node curves
            gathered: list = [None] * d.world
            dist.all_gather_object(gathered, own[0])
            own = gathered
        norm = timer.grad_norm
        self.scalar("loss/train", loss, n)
        self.scalar("lr", lr, n)
        self.scalar("tokens_per_s", tps, n)
        self.scalar("mfu", tps * mfu_scale if mfu_scale else None, n)
        self.scalar("grad_norm", float(norm) if norm is not None else None, n)
        by_node: dict[str, list[float]] = {}
        for node, seconds in own:
            by_node.setdefault(node, []).append(seconds)
        for node, times in sorted(by_node.items()):
            self.scalar(f"step_ms/{node}", 1000 * max(times), n)  # a node is as slow as its slowest rank

    def close(self, args, cfg, summary: dict) -> None:
        if self.writer is None:
            return
        hparams = {
            k: v
            for k, v in {**vars(args), **{f"model.{k}": v for k, v in asdict(cfg).items()}}.items()
            if isinstance(v, int | float | str | bool) and k not in ("summary", "stop_file", "tensorboard")
        }
        metrics = {
            f"hparam/{k}": summary[k]
            for k in ("final_train_loss", "final_val_loss", "tokens_per_s")
            if isinstance(summary.get(k), int | float) and math.isfinite(summary[k])
        }
        self.writer.add_hparams(hparams, metrics, run_name="hparams")
        self.writer.close()


def log(d: Dist, text: str) -> None:
    if d.rank == 0:
        print(text, flush=True)


def peak_tflops_for(gpu_name: str) -> float | None:
    """PEAK_TFLOPS of the longest fragment found in the product name, or None."""
    name = gpu_name.lower()
    found = [frag for frag in PEAK_TFLOPS if frag in name]
    return PEAK_TFLOPS[max(found, key=len)] if found else None


def peak_flops(d: Dist, args) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if d.device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(d.device)
    tflops = peak_tflops_for(name)
    if tflops is None:
        log(d, f"note: no peak FLOP/s known for {name!r}, so no MFU; pass --peak-tflops")
    return tflops * 1e12 if tflops else None


def node_rates(ranks: list[dict]) -> dict[str, float]:
    """Each node's tokens/s: the sum of its own ranks' measured rates."""
    nodes: dict[str, float] = {}
    for r in ranks:
        nodes[r["node"]] = nodes.get(r["node"], 0.0) + r["tokens_per_s"]
    return nodes


def finish(d: Dist, args, history: dict, rate: dict, params: int) -> dict:
    """Gather each rank's own rate and times; rank 0 prints and writes the summary."""
    mine = {
        "rank": d.rank,
        "node": d.node,
        "tokens_per_s": rate["own_tps"],
        "forward_ms": rate["fwd_ms"],
        "step_ms": rate["step_ms"],
        "wait_ms": rate["wait_ms"],
    }
    ranks = [mine]
    if d.world > 1:
        ranks = [None] * d.world
        dist.all_gather_object(ranks, mine)
    nodes = node_rates(ranks)
    summary = {
        "run_id": args.run_id,
        "world_size": d.world,
        "steps": history["last_step"],
        "params": params,
        "tokens_per_s": rate["tps"],
        "mfu": rate["mfu"],
        "final_train_loss": history["train"][-1][1] if history["train"] else None,
        "final_val_loss": history["val"][-1][1] if history["val"] else None,
        "nodes": nodes,
        "ranks": ranks,
        "device": d.device.type,
        "threads": torch.get_num_threads(),
        "train_losses": history["train"],
        "val_losses": history["val"],
        "stopped": history.get("stopped"),  # {"step", "reason"} when --stop-file ended it early
        "checkpoint": history.get("checkpoint"),  # the newest checkpoint this run wrote (tune keeps the best trial's)
    }
    if d.rank == 0:
        short = {k: v for k, v in summary.items() if k not in ("train_losses", "val_losses")}
        print("summary " + json.dumps(short), flush=True)
        if args.summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(Path(args.summary), json.dumps(summary, indent=1).encode())
    return summary


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # No abbreviations: the launcher and the sweep set flags after the user's, and "--step 5"
    # or "--stop-f x" would otherwise reach --steps and --stop-file past their checks.
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    arg = p.add_argument
    arg("--model", default=MODEL, choices=sorted(MODEL_SIZES), help="size preset (gpt2 for MFU on a GPU)")
    for name in ("n_layer", "n_head", "n_embd", "block_size"):
        arg(f"--{name.replace('_', '-')}", type=int, help=f"override the preset's {name}")
    arg("--steps", type=int, default=STEPS, help="total optimizer steps")
    arg(
        "--global-batch",
        type=int,
        help=f"sequences per step, all ranks (default {GLOBAL_BATCH}, rounded up to a multiple of the ranks)",
    )
    arg(
        "--micro-batch",
        type=int,
        help=f"sequences per forward pass (default: the largest divisor of a rank's share up to {MICRO_BATCH})",
    )
    arg("--lr", type=float, default=LEARNING_RATE, help="peak learning rate")
    arg("--warmup-steps", type=int, default=WARMUP_STEPS, help="linear warmup steps")
    arg("--lr-decay-steps", type=int, default=LR_DECAY_STEPS, help="cosine length; 0: --steps")
    arg("--weight-decay", type=float, default=WEIGHT_DECAY, help="AdamW weight decay")
    arg("--grad-clip", type=float, default=GRAD_CLIP, help="gradient norm clip; 0 disables")
    arg("--dropout", type=float, default=DROPOUT, help="dropout probability")
    arg("--seed", type=int, default=SEED, help="seed for init, data order and dropout")
    arg("--eval-interval", type=int, default=EVAL_INTERVAL, help="steps between evaluations")
    arg("--eval-samples", type=int, default=EVAL_SAMPLES, help="validation sequences per eval")
    arg("--log-interval", type=int, default=LOG_INTERVAL, help="steps between train lines")
    arg("--ckpt-interval", type=int, default=CKPT_INTERVAL, help="steps between checkpoints")
    arg("--ckpt-dir", help="checkpoint directory (default /shared/checkpoints if writable, else ./checkpoints)")
    arg("--ckpt-name", default="train_ddp", help="checkpoint file name prefix: <name>-step<N>.pt")
    arg("--resume", action="store_true", help="continue from the newest good checkpoint's step (none: an error)")
    arg(
        "--auto-resume",
        action="store_true",
        help="continue from the newest good checkpoint if there is one, else start at step 0 (restarts)",
    )
    arg(
        "--auto-resume-own",
        action="store_true",
        help="as --auto-resume, from a checkpoint of this --run-id only (a requeued job's restart)",
    )
    arg("--data", help="directory of text files (default: Python's standard library)")
    arg("--data-cache", help="where token files go (default /shared/datasets/train_ddp if writable, else ./data)")
    arg("--data-max-mb", type=int, default=DATA_MAX_MB, help="text to read, in MiB")
    arg("--val-fraction", type=float, default=VAL_FRACTION, help="held-out tail of the text")
    arg(
        "--threads",
        type=int,
        help="CPU threads per rank (default: torch's, all cores); set it when several ranks share one machine's cores",
    )
    arg("--compile", action="store_true", help="torch.compile the model")
    arg("--peak-tflops", type=float, help="peak FLOP/s (in TFLOP/s) for MFU; default by GPU name")
    arg("--summary", help="write the JSON summary here (rank 0)")
    arg(
        "--stop-file",
        help="stop cleanly after an evaluation once this file exists, its first line the reason (tune's pruner)",
    )
    arg(
        "--eval-only",
        action="store_true",
        help="with --resume: evaluate the newest checkpoint of --ckpt-name on the validation split, no training",
    )
    arg(
        "--drop-stragglers",
        type=float,
        metavar="F",
        help="name a node whose own step time (less its wait for the others) stays above F x the other nodes' "
        "median for --straggler-window "
        "steps, at the next checkpoint (provision train --drop-stragglers then takes it out of the run)",
    )
    arg("--straggler-window", type=int, default=STRAGGLER_WINDOW, help="steps a straggler must stay slow")
    arg("--run-id", default="local", help="run identifier, echoed in the summary")
    arg(
        "--tensorboard",
        metavar="DIR",
        help="rank 0 writes TensorBoard event files here: losses, learning rate, tokens/s, MFU, gradient norm, "
        "each node's own step time, and the run's hyperparameters (needs the tensorboard package)",
    )
    args = p.parse_args(argv)
    _check_ranges(p, args)
    if args.drop_stragglers is not None and args.drop_stragglers <= 1:
        p.error(f"--drop-stragglers {args.drop_stragglers:g}: the factor must be above 1")
    if args.straggler_window < 1:
        p.error("--straggler-window must be at least 1")
    if args.eval_only and not args.resume:
        p.error("--eval-only evaluates a checkpoint: give --resume (and --ckpt-dir/--ckpt-name to pick it)")
    return args


# Flags that must be a positive count: 0 divided by (--log-interval, --eval-interval), made an
# empty split (--eval-samples: a NaN loss), or trained nothing and called it done (--steps).
POSITIVE = ("steps", "eval_interval", "eval_samples", "log_interval", "data_max_mb", "straggler_window")
POSITIVE_IF_GIVEN = ("n_layer", "n_head", "n_embd", "block_size", "global_batch", "micro_batch", "threads")
NOT_NEGATIVE = ("warmup_steps", "lr_decay_steps", "ckpt_interval")


def _check_ranges(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each number in its range, and a checkpoint name that stays a file name in --ckpt-dir:
    a bad value is one line and exit 2 here, not a traceback (or a run that "succeeds")
    minutes later on every rank."""
    for name in POSITIVE + POSITIVE_IF_GIVEN:
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value}: must be at least 1")
    for name in NOT_NEGATIVE:
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must not be negative")
    for name in ("lr", "weight_decay", "grad_clip", "dropout", "val_fraction", "peak_tflops", "drop_stragglers"):
        value = getattr(args, name)
        if value is not None and (not math.isfinite(value) or value < 0):
            p.error(f"--{name.replace('_', '-')} {value}: must be a finite number, not negative")
    if not 0 < args.val_fraction < 1:
        p.error(f"--val-fraction {args.val_fraction}: the held-out share must be between 0 and 1")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout {args.dropout}: a probability below 1")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", args.ckpt_name):
        p.error(f"--ckpt-name {args.ckpt_name!r}: a file name prefix (letters, digits, _ . -), not a path")


def batch_sizes(world: int, global_batch: int | None, micro_batch: int | None) -> tuple[int, int, str | None]:
    """(global batch, micro-batch, note) for ``world`` ranks; None means the default.

    The default global batch rounds GLOBAL_BATCH up to a multiple of the ranks (the note
    says so), so that every rank does the same work. A global batch that is given (or a
    resumed checkpoint's) is kept as it is: when it does not split evenly, ranks take
    shares that differ by one sequence (the note says so), and each sequence still counts
    the same (micro_batches). The default micro-batch is the largest divisor of a rank's
    share up to MICRO_BATCH; one that is given need not divide the share."""
    note = None
    if global_batch is None:
        global_batch = -(-GLOBAL_BATCH // world) * world
        if global_batch != GLOBAL_BATCH:
            note = (
                f"note: the default global batch {GLOBAL_BATCH} does not split over {world} ranks; "
                f"using {global_batch} ({global_batch // world} per rank)"
            )
    if global_batch < world:
        raise SystemExit(f"--global-batch {global_batch} is smaller than the {world} ranks: each needs a sequence")
    per_rank, rest = divmod(global_batch, world)
    if rest:
        note = (
            f"note: global batch {global_batch} over {world} ranks: {rest} take {per_rank + 1} sequences, "
            f"the others {per_rank}; every sequence counts the same"
        )
    if micro_batch is None:
        share = per_rank + (1 if rest else 0)
        micro_batch = max(m for m in range(1, min(MICRO_BATCH, share) + 1) if share % m == 0)
    if micro_batch < 1:
        raise SystemExit(f"--micro-batch {micro_batch} must be at least 1")
    return global_batch, micro_batch, note


def model_config(args) -> GPTConfig:
    n_layer, n_head, n_embd, block = MODEL_SIZES[args.model]
    return GPTConfig(
        args.n_layer or n_layer,
        args.n_head or n_head,
        args.n_embd or n_embd,
        args.block_size or block,
        dropout=args.dropout,
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    d = setup_distributed()
    cfg = model_config(args)
    ckpt_dir = Path(args.ckpt_dir or default_ckpt_dir(d))
    state, own = resume_state(d, args, cfg, ckpt_dir)
    # A resumed run keeps the checkpoint's global batch unless one is given: on another
    # number of ranks the steps are then the same steps.
    given_batch = args.global_batch
    if given_batch is None and state is not None:
        given_batch = state.get("global_batch")
    args.global_batch, args.micro_batch, note = batch_sizes(d.world, given_batch, args.micro_batch)
    if note:
        log(d, note)
    train, val = load_tokens(d, args)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model: nn.Module = GPT(cfg).to(d.device)
    params = sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, args)
    start = 0
    resumed_from = None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, resumed_from = state["step"], state["path"]
        was = state.get("world", d.world)
        moved = f"; world size {was} -> {d.world}, global batch {args.global_batch} kept" if was != d.world else ""
        log(d, f"resumed from {state['path']} at step {start}{moved}")
        del state
    elif args.auto_resume or args.auto_resume_own:
        mine = f" of run {own}" if own else ""
        log(d, f"no checkpoint{mine} in {ckpt_dir} yet: starting at step 0")
    if args.eval_only and resumed_from is not None:  # --resume made sure there was a checkpoint
        return evaluate_only(d, model, val, cfg, args, start, resumed_from)
    if args.compile:
        model = torch.compile(model)
    if d.world > 1:
        model = DDP(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    sampler = StepSampler(d, (len(train) - 1) // cfg.block_size, args.global_batch, args.seed)
    log(
        d,
        f"model {args.model}: {params:,} params, {cfg}; world {d.world} on {d.device.type}; "
        f"global batch {args.global_batch} x {cfg.block_size} tokens, micro-batch {args.micro_batch}",
    )
    peak = peak_flops(d, args)
    args.mfu_scale = _raw(model).flops_per_token() / (peak * d.world) if peak else None
    history = run(d, model, opt, sampler, train, val, cfg, args, start, ckpt_dir)
    rate = throughput(d, history, args, cfg, len(sampler.indices(0)))
    summary = finish(d, args, history, rate, params)
    history["events"].close(args, cfg, summary)
    if d.world > 1:
        barrier(d)  # every rank waits until rank 0 has written the summary
        # The DDP wrapper holds the process group. Left alive, the group (and gloo's worker
        # threads) would be destroyed during interpreter shutdown, which aborts the process
        # ("terminate called without an active exception", SIGABRT) now and then, failing
        # a run that had finished. Free it here, while the interpreter is whole.
        del model, opt
        gc.collect()
        dist.destroy_process_group()
    return summary


def resume_state(d: Dist, args, cfg: GPTConfig, ckpt_dir: Path) -> tuple[dict | None, str | None]:
    """(the checkpoint's state to continue from or None, the run id it must belong to)."""
    # --resume and --auto-resume take any checkpoint of the name; --auto-resume-own alone
    # only this run's (an earlier run's checkpoint is not where a restart left off).
    own = args.run_id if args.auto_resume_own and not (args.resume or args.auto_resume) else None
    if not (args.resume or args.auto_resume or args.auto_resume_own):
        return None, own
    return load_checkpoint(d, ckpt_dir, args.ckpt_name, cfg, required=args.resume, run_id=own), own


def evaluate_only(d: Dist, model: nn.Module, val: np.ndarray, cfg: GPTConfig, args, step: int, path: str) -> dict:
    """--eval-only: the loaded checkpoint's validation loss, as a training run at that step
    reported it (the same fixed sequences; tune checks its best trial's copy with this)."""
    vloss = evaluate(d, model, val, cfg, args)
    log(d, f"step {step}/{step} | val loss {vloss:.4f}")
    where = os.path.abspath(path)
    summary = {"run_id": args.run_id, "eval_only": True, "steps": step, "final_val_loss": vloss, "checkpoint": where}
    if d.rank == 0:
        print("summary " + json.dumps(summary), flush=True)
        if args.summary:
            Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(Path(args.summary), json.dumps(summary, indent=1).encode())
    if d.world > 1:
        barrier(d)
        del model
        gc.collect()
        dist.destroy_process_group()
    return summary


def run(d, model, opt, sampler, train, val, cfg, args, start: int, ckpt_dir: Path) -> dict:
    """The loop: train, log, evaluate, checkpoint. Steps are 1-based in logs."""
    history: dict = {"train": [], "val": [], "times": [], "fwd": [], "wait": [], "last_step": start}
    tokens_per_step = args.global_batch * cfg.block_size
    timer = StepTimer(d.device)
    timer.watch(model)
    events = Events(d, args)
    watch = StragglerWatch(d, args.drop_stragglers, args.straggler_window) if args.drop_stragglers else None
    if watch is not None:
        log(
            d,
            f"stragglers: a node whose own step time (less its wait for the others) is over "
            f"{args.drop_stragglers:g}x the other nodes' median over {args.straggler_window} steps is named "
            "at the next checkpoint",
        )
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        loss_t = train_step(d, model, opt, sampler, train, cfg, step, args, timer)
        if d.device.type == "cuda":
            torch.cuda.synchronize()  # the step's one wait for the GPU; the timer's events are done
        dt = time.perf_counter() - t0
        loss = all_mean(d, loss_t)
        n = step + 1
        history["train"].append([n, loss])
        history["times"].append(dt)
        history["fwd"].append(timer.forward_s())
        history["wait"].append(timer.wait_s())
        history["last_step"] = n
        if watch is not None:
            watch.observe(dt - timer.wait_s())
        if n % args.log_interval == 0 or n == args.steps:
            mfu = f" | mfu {tokens_per_step / dt * args.mfu_scale:.1%}" if args.mfu_scale else ""
            log(
                d,
                f"step {n}/{args.steps} | train loss {loss:.4f} | lr {lr_at(step, args):.2e} | "
                f"{tokens_per_step / dt:.0f} tok/s | {dt * 1000:.1f} ms{mfu}",
            )
            events.step(d, n, loss, lr_at(step, args), tokens_per_step / dt, args.mfu_scale, dt, timer)
        if n % args.eval_interval == 0 or n == args.steps:
            vloss = evaluate(d, model, val, cfg, args)
            history["val"].append([n, vloss])
            log(d, f"step {n}/{args.steps} | val loss {vloss:.4f}")
            events.scalar("loss/val", vloss, n)
            stop = stop_requested(d, args.stop_file) if args.stop_file and n < args.steps else None
            if stop is not None:
                history["stopped"] = {"step": n, "reason": stop}
                log(d, f"step {n}/{args.steps} | stopped: {stop}")
                break
        if (args.ckpt_interval and n % args.ckpt_interval == 0) or n == args.steps:
            checkpoint(d, ckpt_dir, model, opt, n, cfg, args, history, watch)
    history["events"] = events
    return history


def checkpoint(d, ckpt_dir: Path, model, opt, n: int, cfg: GPTConfig, args, history: dict, watch) -> None:
    """Save step ``n``; then, with --drop-stragglers, name a straggler: the run resumes
    without it from this checkpoint."""
    saved = save_checkpoint(d, ckpt_dir, args.ckpt_name, model, opt, n, cfg, args)
    if saved is not None:
        history["checkpoint"] = os.path.abspath(saved)
    slow = watch.slow() if watch is not None and n < args.steps else None
    if slow is not None:
        log(
            d,
            f"straggler: dropping {slow[0]}: its own step time stayed above {args.drop_stragglers:g}x "
            f"the other nodes' median over {args.straggler_window} steps ({slow[1]:.2f}x) | checkpoint step {n}",
        )


def stop_requested(d: Dist, path: str) -> str | None:
    """The reason to stop now, or None: rank 0 looks for ``path`` (provision tune writes it
    when its pruner gives up on a trial; the first line is the reason) and every rank gets
    the same answer, so all stop after the same step and none waits in a collective."""
    reason = None
    if d.rank == 0 and os.path.exists(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                first = f.readline(STOP_REASON_CHARS + 1)
        except OSError as e:
            first = f"{path} exists but cannot be read ({e.strerror})"
        reason = "".join(c for c in first.strip() if c.isprintable())[:STOP_REASON_CHARS] or f"{path} exists"
    if d.world > 1:
        flag = torch.tensor([1 if reason is not None else 0], device=d.device)
        dist.broadcast(flag, 0)
        if flag.item() and reason is None:
            reason = "rank 0 was asked to stop"
    return reason


STOP_REASON_CHARS = 200


def own_rate(tokens: int, step_s: float, wait_s: float) -> float:
    """A rank's tokens/s at its own pace: its step time less the time it waited for
    slower ranks. In DDP every rank's step takes as long as the slowest one's, so step
    time alone would give every node the same rate; without the wait, a slow node shows."""
    busy = step_s - wait_s
    return tokens / busy if busy > 0 else float("nan")


def throughput(d, history: dict, args, cfg: GPTConfig, share: int) -> dict:
    """Mean rates over the run, leaving out the first steps (warm-up; torch.compile
    compiles during the first few): the cluster's (rank 0's step time) and this rank's
    own (``own_rate``, over its ``share`` of sequences a step)."""

    def mean(key: str) -> float:
        skip = max(1, min(5, len(history[key]) // 4))
        values = history[key][skip:] or history[key] or [float("nan")]
        return sum(values) / len(values)

    step_s, wait_s, fwd_s = mean("times"), mean("wait"), mean("fwd")
    tps = args.global_batch * cfg.block_size / step_s
    own = own_rate(share * cfg.block_size, step_s, wait_s)
    mfu = tps * args.mfu_scale if args.mfu_scale else None
    if mfu is not None:
        log(d, f"mfu {mfu:.1%} of {peak_flops(d, args) / 1e12:.0f} TFLOP/s per GPU")
    return {
        "tps": tps,
        "own_tps": own,
        "fwd_ms": 1000 * fwd_s,
        "step_ms": 1000 * step_s,
        "wait_ms": 1000 * wait_s,
        "mfu": mfu,
    }


if __name__ == "__main__":
    main()
