"""The reference trainer run for real: torch.distributed with gloo, ranks as processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.unit.test_train_ddp import (
    BASE,
    ENV,
    TIMEOUT_S,
    TRAINER,
    single,
    two_nodes,
)


def test_default_run_is_a_tiny_cpu_smoke_test(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(TRAINER)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1].removeprefix("summary "))
    assert summary["steps"] == 20
    assert summary["world_size"] == 1
    # The untrained model scores about ln(256) = 5.55; twenty steps must learn something.
    assert summary["final_val_loss"] < 5.2
    assert "step 20/20 | val loss" in proc.stdout
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["train_ddp-step00000020.pt"]


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
    args = [
        *BASE,
        "--data-cache",
        str(cache),
        "--steps",
        "8",
        "--global-batch",
        "8",
        "--micro-batch",
        "4",
        "--ckpt-dir",
        str(tmp_path),
    ]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = single(args, tmp_path / "one")
    two = two_nodes(args, tmp_path / "two")
    assert two["world_size"] == 2
    assert set(two["nodes"]) == {"node0", "node1"}
    for r in two["ranks"]:  # each rank measured its own pace: its step less its wait
        assert 0 <= r["wait_ms"] < r["step_ms"]
        assert r["forward_ms"] > 0
        assert r["tokens_per_s"] == pytest.approx(4 * 64 / ((r["step_ms"] - r["wait_ms"]) / 1000))
    a, b = np.array(one["train_losses"]), np.array(two["train_losses"])
    assert a.shape == b.shape == (8, 2)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array(two["val_losses"]), np.array(one["val_losses"]), rtol=0, atol=1e-5)


def test_resume_continues_from_the_checkpoint_with_the_same_losses(tmp_path, cache):
    """3 steps, stop, --resume to 6 steps == 6 steps in one go (same data order, lr, Adam
    state). On the CPU the arithmetic is the same, so the losses are equal exactly."""
    common = [*BASE, "--data-cache", str(cache), "--lr-decay-steps", "6", "--ckpt-interval", "3"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole = single([*common, "--steps", "6", "--ckpt-dir", str(tmp_path / "whole")], tmp_path / "whole")
    ckpt = ["--ckpt-dir", str(tmp_path / "split")]
    first = single([*common, "--steps", "3", *ckpt], tmp_path / "split")
    resumed = single([*common, "--steps", "6", "--resume", *ckpt], tmp_path / "split")
    assert [s for s, _ in first["train_losses"]] == [1, 2, 3]
    assert [s for s, _ in resumed["train_losses"]] == [4, 5, 6]
    assert first["train_losses"] + resumed["train_losses"] == whole["train_losses"]


def test_a_run_resumed_on_another_number_of_ranks_continues_the_same_steps(tmp_path, cache):
    """Two ranks with an uneven global batch of 5 (shares 3 and 2), --auto-resume with no
    checkpoint yet, 4 steps; then one rank --auto-resume to 6 steps, keeping the
    checkpoint's global batch (not given again). The losses equal one rank's 6 steps in one
    go: the sequences and their weights are the same on 2 ranks and 1. Tolerance as in
    test_two_ranks_match_one_rank_at_every_step (summation order only; the issue allows 1e-4)."""
    common = [*BASE, "--data-cache", str(cache), "--lr-decay-steps", "6", "--micro-batch", "2"]
    for d in ("whole", "split"):
        (tmp_path / d).mkdir()
    ckpt = ["--ckpt-dir", str(tmp_path / "split"), "--ckpt-interval", "4"]
    whole = single(
        [*common, "--global-batch", "5", "--steps", "6", "--ckpt-dir", str(tmp_path / "whole")], tmp_path / "whole"
    )
    first = two_nodes([*common, "--global-batch", "5", "--steps", "4", "--auto-resume", *ckpt], tmp_path / "split")
    resumed = single([*common, "--steps", "6", "--auto-resume", *ckpt], tmp_path / "split")
    assert first["world_size"] == 2
    assert resumed["world_size"] == 1
    assert [s for s, _ in first["train_losses"]] == [1, 2, 3, 4]
    assert [s for s, _ in resumed["train_losses"]] == [5, 6]
    np.testing.assert_allclose(
        np.array(first["train_losses"] + resumed["train_losses"]), np.array(whole["train_losses"]), rtol=0, atol=1e-5
    )


def test_a_restart_with_auto_resume_own_continues_its_own_run_never_an_earlier_one(tmp_path, cache):
    """A requeued Slurm job's starts (--auto-resume-own, the same arguments every time): the
    first starts at step 0 although an earlier run left checkpoints of the same name; a
    restart after its own first checkpoint continues from that one."""
    common = [*BASE, "--data-cache", str(cache), "--ckpt-dir", str(tmp_path), "--ckpt-interval", "2"]
    earlier = single([*common, "--steps", "4", "--run-id", "earlier"], tmp_path)
    assert earlier["final_train_loss"] > 0
    mine = [*common, "--run-id", "mine", "--auto-resume-own"]
    first = single([*mine, "--steps", "2"], tmp_path)  # an attempt ended after its first save
    again = single([*mine, "--steps", "4"], tmp_path)
    assert [s for s, _ in first["train_losses"]] == [1, 2]
    assert [s for s, _ in again["train_losses"]] == [3, 4]


def test_resume_without_a_checkpoint_fails_with_a_message(tmp_path, cache):
    proc = subprocess.run(
        [
            sys.executable,
            str(TRAINER),
            *BASE,
            "--data-cache",
            str(cache),
            "--resume",
            "--ckpt-dir",
            str(tmp_path / "none"),
        ],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode != 0
    assert "no checkpoint at" in proc.stderr


def test_threads_option_sets_the_ranks_cpu_threads(tmp_path, cache):
    # OMP_NUM_THREADS does not cross SSH, so ranks sharing a machine's cores need a flag.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    common = [*BASE, "--steps", "2", "--data-cache", str(cache)]
    assert single([*common, "--ckpt-dir", str(tmp_path / "a")], tmp_path / "a")["threads"] == 1  # OMP env
    assert single([*common, "--threads", "2", "--ckpt-dir", str(tmp_path / "b")], tmp_path / "b")["threads"] == 2


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One token cache for the module, so the stdlib is read once."""
    return tmp_path_factory.mktemp("tokens")


def test_a_stop_file_ends_the_run_cleanly_after_the_evaluation_that_finds_it(tmp_path, cache):
    # provision tune's pruner writes the file; the trainer stops after the next evaluation
    # (every 4 steps here), says why, and exits 0 with the steps it ran in its summary.
    stop = tmp_path / "stop"
    common = [*BASE, "--data-cache", str(cache), "--steps", "12", "--stop-file", str(stop)]
    (tmp_path / "full").mkdir()
    full = single([*common, "--ckpt-dir", str(tmp_path / "full")], tmp_path / "full")
    assert (full["stopped"], full["steps"]) == (None, 12)  # no file: the whole run
    stop.write_text("pruned: val loss 5.1 at step 4 is above the median\x1b[31m\nnot read\n")
    (tmp_path / "pruned").mkdir()
    pruned = single([*common, "--ckpt-dir", str(tmp_path / "pruned")], tmp_path / "pruned")
    assert pruned["stopped"] == {"step": 4, "reason": "pruned: val loss 5.1 at step 4 is above the median[31m"}
    assert pruned["steps"] == 4
    assert [s for s, _ in pruned["val_losses"]] == [4]
    assert pruned["train_losses"] == full["train_losses"][:4]


def test_two_ranks_stop_after_the_same_step_when_rank_0_finds_the_stop_file(tmp_path, cache):
    # Only rank 0 reads the file; the other rank learns it from rank 0, so neither waits in
    # a collective the other never joins (two_nodes fails on a non-zero exit or a hang).
    stop = tmp_path / "stop"
    stop.write_text("pruned\n")
    summary = two_nodes([*BASE, "--data-cache", str(cache), "--steps", "12", "--stop-file", str(stop)], tmp_path)
    assert summary["stopped"] == {"step": 4, "reason": "pruned"}
    assert summary["world_size"] == 2
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]


def test_tensorboard_events_read_back_with_tensorboard_s_own_reader(tmp_path, cache):
    """Two ranks (two torchrun agents, as two nodes) with --tensorboard: rank 0's event
    files hold every logged step's train loss as the summary has it, the validation
    losses, the learning rate, tokens/s, the gradient norm, each node's own step time, and
    the run's hyperparameters."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = tmp_path / "tb"
    args = [*BASE, "--data-cache", str(cache), "--steps", "8", "--log-interval", "1", "--ckpt-dir", str(tmp_path)]
    summary = two_nodes([*args, "--tensorboard", str(events)], tmp_path)
    board = EventAccumulator(str(events))
    board.Reload()
    scalars = board.Tags()["scalars"]
    train = [(e.step, e.value) for e in board.Scalars("loss/train")]
    assert [s for s, _ in train] == list(range(1, 9))
    assert [v for _, v in train] == pytest.approx([v for _, v in summary["train_losses"]], rel=1e-6)
    val = board.Scalars("loss/val")
    assert [e.step for e in val] == [s for s, _ in summary["val_losses"]]
    assert [e.value for e in val] == pytest.approx([v for _, v in summary["val_losses"]], rel=1e-6)
    for tag in ("lr", "tokens_per_s", "grad_norm"):
        assert len(board.Scalars(tag)) == 8, tag
    nodes = sorted(t for t in scalars if t.startswith("step_ms/"))
    assert len(nodes) == 2, scalars  # one curve per node: two agents stand for two nodes
    assert all(e.value > 0 for t in nodes for e in board.Scalars(t))
    # the hyperparameters, with the final losses, as TensorBoard's HParams plugin reads them
    hp = EventAccumulator(str(events / "hparams"))
    hp.Reload()
    assert "_hparams_/experiment" in hp.PluginTagToContent("hparams")
    assert hp.Scalars("hparam/final_val_loss")[0].value == pytest.approx(summary["final_val_loss"], rel=1e-6)
