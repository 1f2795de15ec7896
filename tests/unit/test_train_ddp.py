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
from provision.validate import expectations

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single(args: list[str], cwd: Path) -> dict:
    summary = cwd / "summary.json"
    proc = subprocess.run(
        [sys.executable, str(TRAINER), *args, "--summary", str(summary)],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(summary.read_text())


def two_nodes(args: list[str], cwd: Path) -> dict:
    """Two torchrun agents (--nnodes 2, one process each) with a c10d rendezvous."""
    summary, port = cwd / "summary.json", free_port()
    agents = []
    for node in range(2):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "ddptest",
            "--rdzv-conf",
            f"is_host={int(node == 0)}",
            "--max-restarts",
            "0",
            str(TRAINER),
            *args,
            "--summary",
            str(summary),
        ]
        env = {**ENV, "PROVISION_NODE": f"node{node}"}
        agents.append(
            subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    try:
        outputs = [a.communicate(timeout=TIMEOUT_S)[0] for a in agents]
    finally:  # a hung run fails the test without leaving its agents and ranks behind
        for a in agents:
            if a.poll() is None:
                a.kill()  # torchrun's workers die with their agent (pdeathsig)
                a.wait()
    for a, out in zip(agents, outputs, strict=True):
        assert a.returncode == 0, out[-3000:]
    return json.loads(summary.read_text())


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


def sampler(trainer, rank: int, world: int, global_batch: int = 16, n_blocks: int = 1000):
    return trainer.StepSampler(trainer.Dist(rank, rank, world, None, "n"), n_blocks, global_batch, seed=7)


def test_ranks_together_read_the_single_rank_batch_at_every_step():
    trainer = load_trainer()
    one = sampler(trainer, 0, 1)
    pair = [sampler(trainer, 0, 2), sampler(trainer, 1, 2)]
    for step in (0, 1, 61, 62, 63, 500):  # 62 steps per epoch: crosses epochs
        assert sorted(one.indices(step)) == sorted(pair[0].indices(step) + pair[1].indices(step))
    assert one.indices(0) != one.indices(62)  # a new epoch is a new permutation


@pytest.mark.parametrize("world", range(1, 17))
@pytest.mark.parametrize("global_batch", [16, 30])
def test_any_world_size_reads_the_same_global_batch_and_weighs_every_sequence_the_same(world, global_batch):
    """The batch arithmetic of a changed world size: for 1 to 16 ranks, the ranks' shares
    are the one-rank batch of the step (nothing lost, nothing twice), they differ by one
    sequence at most, and after DDP's mean over ranks every sequence's loss counts
    1/global batch, whatever the micro-batch."""
    trainer = load_trainer()
    whole = sampler(trainer, 0, 1, global_batch)
    ranks = [sampler(trainer, r, world, global_batch) for r in range(world)]
    for step in (0, 1, 32, 33, 200):  # 33 (or 62) steps an epoch: crosses epochs
        shares = [r.indices(step) for r in ranks]
        assert sorted(i for share in shares for i in share) == sorted(whole.indices(step))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    for micro in (1, 3, 8):
        per_sequence = []
        for share in (len(r.indices(0)) for r in ranks):
            parts = trainer.micro_batches(share, micro, world, global_batch)
            assert [lo for lo, _, _ in parts] == list(range(0, share, micro))
            assert parts[-1][1] == share
            assert all(hi - lo <= micro for lo, hi, _ in parts)
            # a micro-batch's mean loss times its weight, then DDP's mean over the ranks
            per_sequence += [weight / (hi - lo) / world for lo, hi, weight in parts for _ in range(hi - lo)]
        assert len(per_sequence) == global_batch
        assert per_sequence == pytest.approx([1 / global_batch] * global_batch)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    trainer = load_trainer()
    args = trainer.parse_args(["--steps", "100", "--warmup-steps", "10", "--lr", "1.0"])
    assert trainer.lr_at(0, args) == pytest.approx(0.1)
    assert trainer.lr_at(9, args) == pytest.approx(1.0)
    assert trainer.lr_at(99, args) == pytest.approx(0.1, abs=1e-3)


@pytest.mark.parametrize(("world", "micro"), [(1, 8), (2, 8), (8, 2), (16, 1)])
def test_default_batch_splits_over_one_node_and_the_docstrings_eight_and_sixteen_gpus(world, micro):
    trainer = load_trainer()
    assert trainer.batch_sizes(world, None, None) == (16, micro, None)


def test_default_global_batch_rounds_up_to_the_ranks_with_a_note():
    trainer = load_trainer()
    global_batch, micro, note = trainer.batch_sizes(32, None, None)
    assert (global_batch, micro) == (32, 1)
    assert "using 32 (1 per rank)" in note
    global_batch, micro, note = trainer.batch_sizes(3, None, None)
    assert (global_batch, micro) == (18, 6)
    assert "does not split over 3 ranks" in note


def test_a_given_global_batch_is_kept_on_any_world_size_and_uneven_shares_are_said():
    trainer = load_trainer()
    assert trainer.batch_sizes(8, 64, None) == (64, 8, None)
    assert trainer.batch_sizes(2, None, 4) == (16, 4, None)
    assert trainer.batch_sizes(8, 16, 8) == (16, 8, None)  # a micro-batch larger than the share: one pass
    global_batch, micro, note = trainer.batch_sizes(3, 16, None)
    assert (global_batch, micro) == (16, 6)  # shares 6, 5, 5
    assert "1 take 6 sequences, the others 5" in note
    assert trainer.batch_sizes(2, None, 3) == (16, 3, None)  # passes of 3, 3 and 2
    with pytest.raises(SystemExit, match="--global-batch 2 is smaller than the 3 ranks"):
        trainer.batch_sizes(3, 2, None)
    with pytest.raises(SystemExit, match="--global-batch 0"):
        trainer.batch_sizes(1, 0, None)
    with pytest.raises(SystemExit, match="--micro-batch 0 must be at least 1"):
        trainer.batch_sizes(2, None, 0)


def test_peak_flops_table_is_the_validate_gpu_specs():
    trainer = load_trainer()
    specs = {hint: spec.bf16_tflops for spec in expectations.GPU_SPECS for hint in spec.name_hints}
    assert specs == trainer.PEAK_TFLOPS


def test_peak_flops_take_the_most_specific_gpu_name():
    """Product names as NVML and nvidia-smi print them: the captured ones, and the PCIe,
    NVL and Blackwell parts that a plain "H100"/"H200" fragment used to mistake."""
    trainer = load_trainer()
    fixtures = Path(__file__).parent.parent / "fixtures"
    captured = {
        line.split(":", 1)[1].strip()
        for f in fixtures.glob("nvidia-smi-a_*.txt")
        for line in f.read_text().splitlines()
        if "Product Name" in line
    }
    captured |= {
        line.split("<product_name>")[1].split("<")[0]
        for f in fixtures.glob("nvidia-smi-q-x_*.xml")
        for line in f.read_text().splitlines()
        if "<product_name>" in line
    }
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "NVIDIA H200"} <= captured
    names = captured | {"NVIDIA H100 PCIe", "NVIDIA H200 NVL", "NVIDIA B200", "NVIDIA GH200 480GB"}
    for name in names:
        sku = expectations.find_sku(name, None)
        assert trainer.peak_tflops_for(name) == (sku.bf16_tflops if sku else None), name
    assert trainer.peak_tflops_for("NVIDIA H100 PCIe") == 756.5
    assert trainer.peak_tflops_for("NVIDIA H100 NVL") == 835.5
    assert trainer.peak_tflops_for("NVIDIA H200 NVL") == 835.5
    assert trainer.peak_tflops_for("NVIDIA B200") == 2250.0
    assert trainer.peak_tflops_for("NVIDIA RTX A5000") is None


class FakeCudaEvent:
    """torch.cuda.Event on a GPU clock that the test moves (milliseconds)."""

    gpu_ms = 0.0

    def __init__(self, enable_timing: bool = False):
        self.at = None

    def record(self) -> None:
        self.at = FakeCudaEvent.gpu_ms

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return end.at - self.at


def test_forward_time_on_a_gpu_comes_from_cuda_events_not_the_host_clock(monkeypatch):
    """Kernels run asynchronously: the host returns from a forward pass long before the
    GPU has done it, so only the GPU's own clock times it."""
    trainer = load_trainer()
    import torch

    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    timer = trainer.StepTimer(torch.device("cuda"))
    for _ in range(2):  # two micro-batches, each 250 ms of GPU work launched in no time
        with timer.forward():
            FakeCudaEvent.gpu_ms += 250.0
    timer._mark_ready(())
    FakeCudaEvent.gpu_ms += 40.0  # waiting for the other ranks' gradients
    timer.synced = timer.now()
    assert timer.forward_s() == pytest.approx(0.5)
    assert timer.wait_s() == pytest.approx(0.04)


def test_a_training_step_reads_the_loss_from_the_device_not_once_per_micro_batch(monkeypatch):
    """Tensor.item() on the loss waits for the device; a step of 4 micro-batches must not
    wait 4 times. The step returns the loss on the device for one read per step."""
    trainer = load_trainer()
    import torch

    reads = []
    item = torch.Tensor.item

    def counting_item(self):
        if self.grad_fn is not None or self.requires_grad:
            reads.append(self)
        return item(self)

    d = trainer.Dist(0, 0, 1, torch.device("cpu"), "n")
    args = trainer.parse_args(["--global-batch", "8", "--micro-batch", "2"])
    cfg = trainer.GPTConfig(1, 1, 16, 8)
    torch.manual_seed(0)
    model = trainer.GPT(cfg)
    opt = trainer.make_optimizer(model, args)
    data = np.random.default_rng(0).integers(0, 256, 4096).astype(np.uint8)
    sampler = trainer.StepSampler(d, (len(data) - 1) // cfg.block_size, 8, seed=1)
    timer = trainer.StepTimer(d.device)
    timer.watch(model)
    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    loss = trainer.train_step(d, model, opt, sampler, data, cfg, 0, args, timer)
    assert reads == []
    assert isinstance(loss, torch.Tensor)
    assert loss.dim() == 0
    assert 5.0 < trainer.all_mean(d, loss) < 6.0
    assert len(timer.forwards) == 4
    assert timer.forward_s() > 0
    assert timer.wait_s() >= 0


def test_a_node_that_waits_for_a_slow_one_reports_its_own_faster_rate():
    """In DDP every rank's step lasts as long as the slowest rank's; a rank's own rate
    leaves out its wait, so the nodes' rates differ when one node is slow."""
    trainer = load_trainer()
    args = trainer.parse_args(["--global-batch", "8", "--micro-batch", "4"])
    args.mfu_scale = None
    cfg = trainer.GPTConfig(2, 2, 64, 64)
    d = trainer.Dist(1, 0, 2, None, "fast")
    history = {"times": [9.0, 0.2, 0.2], "wait": [0.0, 0.1, 0.1], "fwd": [1.0, 0.02, 0.02]}
    rate = trainer.throughput(d, history, args, cfg, 4)  # this rank: 4 of the 8 sequences a step
    assert rate["tps"] == pytest.approx(8 * 64 / 0.2)  # the cluster: the first step left out
    assert rate["own_tps"] == pytest.approx(4 * 64 / 0.1)  # this rank: step less its wait
    assert (rate["step_ms"], rate["wait_ms"], rate["fwd_ms"]) == pytest.approx((200, 100, 20))
    ranks = [
        {"node": "fast", "tokens_per_s": 2560.0},
        {"node": "fast", "tokens_per_s": 2560.0},
        {"node": "slow", "tokens_per_s": 1280.0},
    ]
    assert trainer.node_rates(ranks) == {"fast": 5120.0, "slow": 1280.0}


def test_checkpoints_fall_back_to_a_local_directory_with_a_line_that_says_so(monkeypatch, capsys, tmp_path):
    trainer = load_trainer()
    d = trainer.Dist(0, 0, 1, None, "n")
    monkeypatch.setattr(trainer, "SHARED", tmp_path / "nfs")  # not mounted
    assert trainer.default_ckpt_dir(d) == Path("checkpoints")
    said = capsys.readouterr().out
    assert f"{tmp_path}/nfs/checkpoints is not writable here" in said
    assert "--ckpt-dir" in said
    (tmp_path / "nfs" / "checkpoints").mkdir(parents=True)
    assert trainer.default_ckpt_dir(d) == tmp_path / "nfs" / "checkpoints"
    assert capsys.readouterr().out == ""


def test_the_device_checks_mfu_runs_the_gpt2_preset_which_is_gpt2_small_sized_unlike_medium():
    tr = load_trainer()

    def params(preset: str) -> int:
        with tr.torch.device("meta"):  # shapes only: no 85M parameters allocated
            model = tr.GPT(tr.GPTConfig(*tr.MODEL_SIZES[preset]))
        return sum(p.numel() for p in model.parameters())

    assert 80e6 < params("gpt2") < 90e6  # GPT-2 small's blocks; its 50k-token embedding is not needed here
    assert params("medium") < 15e6
    check = (Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh").read_text()
    (train,) = [line for line in check.splitlines() if line.startswith("step train ")]
    assert "--model gpt2 " in train
    assert "--compile" in check.split("step train ", 1)[1]


def _save(trainer, directory: Path, step: int, model, opt, cfg) -> None:
    args = trainer.parse_args(["--global-batch", "8"])
    trainer.save_checkpoint(trainer.Dist(0, 0, 1, None, "n"), directory, "run", model, opt, step, cfg, args)


def _tiny(trainer):
    import torch

    cfg = trainer.model_config(trainer.parse_args([]))
    model = trainer.GPT(cfg)
    return model, torch.optim.AdamW(model.parameters()), cfg


def test_checkpoints_keep_the_newest_two_and_the_newest_good_one_is_chosen(tmp_path, capsys):
    trainer = load_trainer()
    model, opt, cfg = _tiny(trainer)
    for step in (2, 4, 6):
        _save(trainer, tmp_path, step, model, opt, cfg)
    assert [s for s, _ in trainer.checkpoint_files(tmp_path, "run")] == [6, 4]
    assert not list(tmp_path.glob(".*"))  # no temporary file left
    path, state = trainer.newest_good_checkpoint(tmp_path, "run")
    assert (path.name, state["step"], state["global_batch"], state["world"]) == ("run-step00000006.pt", 6, 8, 1)


def test_a_run_started_afresh_supersedes_an_earlier_runs_later_checkpoints(tmp_path):
    """A run of 6 steps, then a new run (no --resume) saving step 2: step 6 was the earlier
    run's, and a --resume must continue the new one."""
    trainer = load_trainer()
    model, opt, cfg = _tiny(trainer)
    for step in (4, 6):
        _save(trainer, tmp_path, step, model, opt, cfg)
    _save(trainer, tmp_path, 2, model, opt, cfg)
    assert [s for s, _ in trainer.checkpoint_files(tmp_path, "run")] == [2]


def test_a_restart_of_a_run_continues_only_that_runs_own_checkpoints(tmp_path):
    """--auto-resume-own (a requeued Slurm job): checkpoints of the same name that another
    run wrote are passed over with a note, so a restart before the run's own first save
    starts at step 0 rather than continuing the earlier run; after it, its own is taken."""
    trainer = load_trainer()
    model, opt, cfg = _tiny(trainer)

    def save(step: int, run: str) -> None:
        args = trainer.parse_args(["--global-batch", "8", "--run-id", run])
        trainer.save_checkpoint(trainer.Dist(0, 0, 1, None, "n"), tmp_path, "run", model, opt, step, cfg, args)

    save(6, "earlier")
    said: list[str] = []
    assert trainer.newest_good_checkpoint(tmp_path, "run", said.append, run_id="mine") is None
    assert len(said) == 1
    assert "run earlier's, not this run's (mine)" in said[0]
    assert trainer.newest_good_checkpoint(tmp_path, "run")[1]["step"] == 6  # --resume: any run's
    save(2, "earlier")
    save(4, "mine")
    said = []
    path, state = trainer.newest_good_checkpoint(tmp_path, "run", said.append, run_id="mine")
    assert (path.name, state["step"], state["run_id"]) == ("run-step00000004.pt", 4, "mine")
    assert said == []
    path, state = trainer.newest_good_checkpoint(tmp_path, "run", said.append, run_id="earlier")
    assert (path.name, state["step"]) == ("run-step00000002.pt", 2)


def test_a_torn_checkpoint_is_skipped_with_a_note_and_the_one_before_it_is_used(tmp_path):
    trainer = load_trainer()
    model, opt, cfg = _tiny(trainer)
    for step in (4, 6):
        _save(trainer, tmp_path, step, model, opt, cfg)
    newest = tmp_path / "run-step00000006.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn: a crash mid-copy
    (tmp_path / ".run-step00000008.pt.tmp").write_bytes(b"half a save")  # never a candidate
    said = []
    path, state = trainer.newest_good_checkpoint(tmp_path, "run", said.append)
    assert (path.name, state["step"]) == ("run-step00000004.pt", 4)
    assert len(said) == 1
    assert "skipped checkpoint" in said[0]
    assert "run-step00000006.pt" in said[0]
    assert "does not load" in said[0]


def test_two_files_that_claim_the_same_step_the_one_whose_content_agrees_wins(tmp_path):
    """A checkpoint copied in by hand under another step's name holds its own step: it is
    passed over with a note rather than resumed as if it were that step."""
    trainer = load_trainer()
    model, opt, cfg = _tiny(trainer)
    _save(trainer, tmp_path, 4, model, opt, cfg)
    _save(trainer, tmp_path / "other", 4, model, opt, cfg)
    (tmp_path / "other" / "run-step00000004.pt").rename(tmp_path / "run-step00000009.pt")
    said = []
    path, state = trainer.newest_good_checkpoint(tmp_path, "run", said.append)
    assert (path.name, state["step"]) == ("run-step00000004.pt", 4)
    assert said == [f"note: skipped checkpoint {tmp_path}/run-step00000009.pt: it holds step 4, its name says 9"]
    assert trainer.newest_good_checkpoint(tmp_path / "none", "run") is None


def test_eval_only_needs_a_checkpoint_to_evaluate(capsys):
    trainer = load_trainer()
    with pytest.raises(SystemExit):
        trainer.parse_args(["--eval-only"])
    assert "give --resume" in capsys.readouterr().err
    args = trainer.parse_args(["--eval-only", "--resume", "--ckpt-name", "best"])
    assert (args.eval_only, args.resume, args.ckpt_name) == (True, True, "best")


def straggler_watch(history: list[dict[str, float]], factor: float = 1.5):
    """A watch with its per-step history given (observe() needs a process group)."""
    trainer = load_trainer()
    watch = trainer.StragglerWatch.__new__(trainer.StragglerWatch)
    watch.factor, watch.window, watch.history = factor, len(history), history
    return watch


def test_a_node_slower_than_the_others_median_over_the_window_is_named_with_its_ratio():
    steps = [{"a": 1.0, "b": 1.1, "c": 2.4}] * 4
    assert straggler_watch(steps).slow() == ("c", 2.4 / 1.05)
    # Two nodes: against the other one (the median of both could never be exceeded twice).
    assert straggler_watch([{"a": 1.0, "b": 2.0}] * 3).slow() == ("b", 2.0)


def test_one_noisy_step_neither_names_a_node_nor_saves_a_slow_one():
    slow_but_one = [{"a": 1.0, "b": 2.0}] * 4 + [{"a": 1.0, "b": 1.0}]
    assert straggler_watch(slow_but_one).slow() == ("b", 2.0)
    fast_but_one = [{"a": 1.0, "b": 1.0}] * 4 + [{"a": 1.0, "b": 9.0}]
    assert straggler_watch(fast_but_one).slow() is None


def test_no_straggler_before_a_full_window_or_with_one_node_or_below_the_factor():
    watch = straggler_watch([{"a": 1.0, "b": 3.0}] * 3)
    watch.window = 4
    assert watch.slow() is None
    assert straggler_watch([{"a": 1.0}] * 3).slow() is None
    assert straggler_watch([{"a": 1.0, "b": 1.4}] * 3).slow() is None


def test_drop_stragglers_needs_a_factor_above_one_and_a_window():
    trainer = load_trainer()
    with pytest.raises(SystemExit):
        trainer.parse_args(["--drop-stragglers", "1"])
    with pytest.raises(SystemExit):
        trainer.parse_args(["--drop-stragglers", "2", "--straggler-window", "0"])
    assert trainer.parse_args(["--drop-stragglers", "1.5"]).straggler_window == trainer.STRAGGLER_WINDOW


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--log-interval", "0"], "--log-interval 0: must be at least 1"),  # ZeroDivisionError a step later
        (["--eval-interval", "0"], "--eval-interval 0: must be at least 1"),
        (["--eval-samples", "0"], "--eval-samples 0: must be at least 1"),  # a NaN validation loss, "ok"
        (["--steps", "-5"], "--steps -5: must be at least 1"),  # trained nothing and called it done
        (["--threads", "-1"], "--threads -1: must be at least 1"),
        (["--block-size", "0"], "--block-size 0: must be at least 1"),
        (["--val-fraction", "0"], "--val-fraction 0.0: the held-out share must be between 0 and 1"),
        (["--val-fraction", "nan"], "--val-fraction nan: must be a finite number"),
        (["--lr", "inf"], "--lr inf: must be a finite number"),
        (["--ckpt-name", "../escaped"], "--ckpt-name '../escaped': a file name prefix"),  # written outside --ckpt-dir
        (["--ckpt-name", "a/b"], "--ckpt-name 'a/b': a file name prefix"),
    ],
)
def test_a_flag_out_of_its_range_is_one_line_and_exit_2(argv, said, capsys):
    trainer = load_trainer()
    with pytest.raises(SystemExit) as e:
        trainer.parse_args(argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err


def test_the_flags_the_launcher_and_the_sweep_pass_are_in_range():
    trainer = load_trainer()
    args = trainer.parse_args(["--steps", "30", "--ckpt-name", "tune-e2e.v2-t12", "--run-id", "train-20261207-1"])
    assert (args.steps, args.ckpt_name) == (30, "tune-e2e.v2-t12")
