"""The reference trainer, run for real on the CPU: smoke run, DDP correctness, resume.

DDP runs use real torch.distributed (gloo) with two torchrun agents that meet through a
c10d rendezvous on loopback, i.e. two one-process "nodes", the way `provision train`
starts them on a cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from provision.resources import training_script

TRAINER = training_script()
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT_S = 240
# A small, fixed configuration: 1 MiB of stdlib text, tiny model.
BASE = ["--data-max-mb", "1", "--eval-interval", "4", "--eval-samples", "16"]


def load_trainer():
    spec = importlib.util.spec_from_file_location("train_ddp", TRAINER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_ddp"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One token cache for the module, so the stdlib is read once."""
    return tmp_path_factory.mktemp("tokens")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single(args: list[str], cwd: Path) -> dict:
    summary = cwd / "summary.json"
    proc = subprocess.run([sys.executable, str(TRAINER), *args, "--summary", str(summary)],
                          cwd=cwd, env=ENV, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def two_nodes(args: list[str], cwd: Path) -> dict:
    """Two torchrun agents (--nnodes 2, one process each) with a c10d rendezvous."""
    summary, port = cwd / "summary.json", free_port()
    agents = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ddptest",
               "--rdzv-conf", f"is_host={int(node == 0)}", "--max-restarts", "0",
               str(TRAINER), *args, "--summary", str(summary)]
        env = {**ENV, "PROVISION_NODE": f"node{node}"}
        agents.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True))
    outputs = [a.communicate(timeout=TIMEOUT_S)[0] for a in agents]
    for a, out in zip(agents, outputs, strict=True):
        assert a.returncode == 0, out[-3000:]
    return json.loads(summary.read_text())


def test_default_run_is_a_tiny_cpu_smoke_test(tmp_path):
    proc = subprocess.run([sys.executable, str(TRAINER)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1].removeprefix("summary "))
    assert summary["steps"] == 20 and summary["world_size"] == 1
    # The untrained model scores about ln(256) = 5.55; twenty steps must learn something.
    assert summary["final_val_loss"] < 5.2
    assert "step 20/20 | val loss" in proc.stdout
    assert (tmp_path / "checkpoints" / "train_ddp.pt").is_file()


def test_two_ranks_match_one_rank_at_every_step(tmp_path, cache):
    """Same seed, steps and global batch (8): one rank accumulates 2 micro-batches of 4,
    two ranks take 4 each and all-reduce. The losses must agree at every step.

    Tolerance: the math is identical; only float32 summation order differs (1 rank sums
    two halves of the gradient, gloo sums the two ranks' halves; cross-entropy means
    are taken over 256 vs 2x128 tokens). Such differences are a few ulp (~1e-7
    relative) per step, and Adam turns them into updates that differ by about as
    much. Measured: at most 5e-7 apart over 8 steps. 1e-5 absolute leaves room for
    that drift while still catching any real mistake (a wrong shard, a missing
    all-reduce, double counting), which moves the loss by 1e-2 or more.
    """
    args = [*BASE, "--data-cache", str(cache), "--steps", "8", "--global-batch", "8",
            "--micro-batch", "4", "--ckpt-dir", str(tmp_path)]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = single(args, tmp_path / "one")
    two = two_nodes(args, tmp_path / "two")
    assert two["world_size"] == 2 and set(two["nodes"]) == {"node0", "node1"}
    a, b = np.array(one["train_losses"]), np.array(two["train_losses"])
    assert a.shape == b.shape == (8, 2)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array(two["val_losses"]), np.array(one["val_losses"]),
                               rtol=0, atol=1e-5)


def test_resume_continues_from_the_checkpoint_with_the_same_losses(tmp_path, cache):
    """3 steps, stop, --resume to 6 steps == 6 steps in one go (same data order, lr, Adam
    state). On the CPU the arithmetic is the same, so the losses are equal exactly."""
    common = [*BASE, "--data-cache", str(cache), "--lr-decay-steps", "6", "--ckpt-interval", "3"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole = single([*common, "--steps", "6", "--ckpt-dir", str(tmp_path / "whole")],
                   tmp_path / "whole")
    ckpt = ["--ckpt-dir", str(tmp_path / "split")]
    first = single([*common, "--steps", "3", *ckpt], tmp_path / "split")
    resumed = single([*common, "--steps", "6", "--resume", *ckpt], tmp_path / "split")
    assert [s for s, _ in first["train_losses"]] == [1, 2, 3]
    assert [s for s, _ in resumed["train_losses"]] == [4, 5, 6]
    assert first["train_losses"] + resumed["train_losses"] == whole["train_losses"]


def test_resume_without_a_checkpoint_fails_with_a_message(tmp_path, cache):
    proc = subprocess.run(
        [sys.executable, str(TRAINER), *BASE, "--data-cache", str(cache), "--resume",
         "--ckpt-dir", str(tmp_path / "none")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode != 0
    assert "no checkpoint at" in proc.stderr


def test_data_option_reads_any_directory_of_text_files(tmp_path):
    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    (src / "b.md").write_text("# notes\n" + "lorem ipsum dolor sit amet " * 400)
    (src / "blob.bin").write_bytes(b"\0\1\2" * 1000)  # binary: skipped
    trainer = load_trainer()
    meta = trainer.prepare_tokens(src, tmp_path / "out", 1 << 20, 0.1)
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint8)
    val = np.fromfile(tmp_path / "out" / "val.bin", dtype=np.uint8)
    text = (src / "a.txt").read_bytes() + b"\n" + (src / "b.md").read_bytes()
    assert meta["train_tokens"] + meta["val_tokens"] == len(text)
    assert bytes(train) + bytes(val) == text
    assert meta["val_tokens"] == len(text) - int(len(text) * 0.9)


def test_ranks_together_read_the_single_rank_batch_at_every_step():
    trainer = load_trainer()
    def sampler(rank: int, world: int):
        d = trainer.Dist(rank, rank, world, None, "n")
        return trainer.StepSampler(d, 1000, 16 // world, seed=7)
    one = sampler(0, 1)
    pair = [sampler(0, 2), sampler(1, 2)]
    for step in (0, 1, 61, 62, 63, 500):  # 62 steps per epoch: crosses epochs
        assert sorted(one.indices(step)) == sorted(pair[0].indices(step) + pair[1].indices(step))
    assert one.indices(0) != one.indices(62)  # a new epoch is a new permutation


def test_learning_rate_warms_up_then_decays_to_the_floor():
    trainer = load_trainer()
    args = trainer.parse_args(["--steps", "100", "--warmup-steps", "10", "--lr", "1.0"])
    assert trainer.lr_at(0, args) == pytest.approx(0.1)
    assert trainer.lr_at(9, args) == pytest.approx(1.0)
    assert trainer.lr_at(99, args) == pytest.approx(0.1, abs=1e-3)


def test_threads_option_sets_the_ranks_cpu_threads(tmp_path, cache):
    # OMP_NUM_THREADS does not cross SSH, so ranks sharing a machine's cores need a flag.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    common = [*BASE, "--steps", "2", "--data-cache", str(cache)]
    assert single([*common, "--ckpt-dir", str(tmp_path / "a")], tmp_path / "a")["threads"] == 1  # OMP env
    assert single([*common, "--threads", "2", "--ckpt-dir", str(tmp_path / "b")], tmp_path / "b")["threads"] == 2
