"""The agent's phases: each bounded by its own time budget, each result streamed at once.

Clocks are injected (a stand-in clock that moves a fixed step per read), so these tests
assert repetition counts, sizes and reasons, never how long something took."""

from __future__ import annotations

import io
import json
import threading
import types

import pytest
import torch

from provision.validate import agent


class StandInClock:
    """A clock for Budget: every read moves it ``step`` seconds on."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


CPU = {"cores": 2, "threads": 2, "ghz": 2.0, "isa": agent._isa({"avx2", "fma"}), "llc_bytes": 32 << 20}


def run_one(fn, budget: agent.Budget) -> list[dict]:
    res = agent.Results()
    fn(budget, agent.Sink(res, "test"))
    return res.rows


def test_repeat_stops_at_its_repetition_count_when_the_budget_allows():
    budget = agent.Budget(1000, StandInClock(1.0))
    assert len(agent.repeat(lambda: None, budget, 4)) == 4


def test_repeat_stops_before_a_repetition_that_would_end_past_the_budget():
    clock = StandInClock(0.0)  # only the repetitions move it: 3 s each

    def rep():
        clock.now += 3.0

    budget = agent.Budget(10, clock)
    times = agent.repeat(rep, budget, 100)
    assert times == [3.0, 3.0, 3.0]  # 1 s is left after three: a fourth would end past 10 s
    assert agent.reps_note(len(times), 100, budget) == "3 of 100 reps (10 s budget reached)"


def test_a_spent_budget_runs_no_repetition():
    budget = agent.Budget(1, StandInClock(5.0))
    assert agent.repeat(lambda: None, budget, 4) == []


def test_cpu_gemm_size_fits_a_tenth_of_the_budget_at_the_probed_speed():
    cfg = {"cpu_n": 1536}
    assert agent.cpu_gemm_n(cfg, 8, 1000.0, agent.Budget(30)) == 1536  # a fast node keeps the mode's n
    slow = agent.cpu_gemm_n(cfg, 8, 0.5, agent.Budget(30))  # 0.5 GFLOP/s: one rep within 3 s
    assert 2 * slow**3 / 0.5e9 <= 3.0
    assert slow % 64 == 0
    assert slow >= agent.PROBE_N


def test_cpu_phase_on_a_slow_node_shrinks_its_gemm_counts_its_reps_and_says_so():
    cfg = {"cpu_n": 512, "cpu_reps": 4}
    before = torch.get_num_threads()
    try:
        rows = run_one(lambda b, o: agent.bench_cpu(torch, cfg, CPU, b, o), agent.Budget(20, StandInClock(0.5)))
    finally:
        torch.set_num_threads(before)
    gemm = next(r for r in rows if r["metric"] == "cpu_gemm_gflops")
    assert gemm["detail"].startswith(f"n={agent.PROBE_N}, 2 threads, best of 4 reps")
    assert "n reduced from 512 to fit the 20 s budget on this node (slow, emulated or busy)" in gemm["detail"]


def test_cpu_phase_with_no_time_left_says_so_instead_of_a_value():
    before = torch.get_num_threads()
    try:
        rows = run_one(lambda b, o: agent.bench_cpu(torch, {"cpu_n": 256, "cpu_reps": 4}, CPU, b, o), agent.Budget(0))
    finally:
        torch.set_num_threads(before)
    assert {r["metric"] for r in rows} == set(agent.CPU_METRICS)
    assert all(r["not_run"] == "not run: no GEMM fitted in the 0 s budget" for r in rows)


def test_ram_phase_on_a_slow_node_shrinks_its_arrays_counts_its_passes_and_says_so():
    ram = {"total_bytes": 8 << 30}
    before = torch.get_num_threads()
    try:
        rows = run_one(
            lambda b, o: agent.bench_ram(torch, {"stream_reps": 6}, CPU, ram, b, o), agent.Budget(4, StandInClock(0.1))
        )
    finally:
        torch.set_num_threads(before)
    assert {r["metric"] for r in rows} == set(agent.RAM_METRICS)
    detail = rows[0]["detail"]
    assert "reduced from 128 MiB (under 4x the LLC) to fit the 4 s budget" in detail
    assert "of 6 reps (4 s budget reached)" in detail  # the stand-in clock ran out first


def test_fio_runtime_and_file_come_from_the_budget_on_a_slow_disk():
    cfg = agent.MODES["quick"]
    fast = agent.fio_plan(cfg, 2000.0, 45)
    assert (fast.size_mib, fast.runtime_s, fast.ramp_s, fast.note) == (512, 3, 1, "")
    slow = agent.fio_plan(cfg, 10.0, 12)  # 10 MiB/s, 12 s left
    assert slow.size_mib == 24  # written in a fifth of the time left
    assert (slow.runtime_s, slow.ramp_s) == (2, 0)  # three jobs in half of it, no ramp to spare
    assert (
        slow.note
        == "; reduced to fit the time budget: file 24 MiB instead of 512 (writes at 10 MiB/s), 2 s per job instead of 3"
    )


def test_outer_deadline_is_the_sum_of_the_phase_budgets_plus_the_margin():
    quick = agent.BUDGETS_S["quick"]
    assert agent.outer_deadline_s("quick") == sum(quick.values()) + agent.MARGIN_S["quick"]
    assert agent.outer_deadline_s("quick", {**quick, "cpu": 0}) == agent.outer_deadline_s("quick") - quick["cpu"]


def test_phase_past_its_budget_is_timed_out_its_late_rows_dropped_and_the_next_phase_runs(monkeypatch):
    monkeypatch.setattr(agent, "GRACE_S", 0)
    release = threading.Event()
    finished = threading.Event()

    def hangs(budget, out):  # a CPU call that cannot be interrupted, then a row too late
        release.wait(30)
        out.add("cpu_gemm_gflops", 1.0)
        finished.set()

    res = agent.Results()
    phases = [
        agent.Phase("cpu", 0.01, agent.CPU_METRICS, "", hangs),
        agent.Phase("ram", 60, ("ram_copy_gbs",), "", lambda b, o: o.add("ram_copy_gbs", 5.0)),
    ]
    for p in phases:
        agent.run_phases([p], res)
    release.set()
    assert finished.wait(30)
    by_metric = {r["metric"]: r for r in res.rows}
    assert by_metric["cpu_gemm_gflops"]["not_run"] == "not run: timed out after 0.01 s (phase cpu)"
    assert by_metric["cpu_gemm_peak_fraction"]["not_run"] == "not run: timed out after 0.01 s (phase cpu)"
    assert by_metric["ram_copy_gbs"]["value"] == 5.0
    assert len(res.rows) == 3  # the late value never joined the results


def test_phase_that_cannot_run_gives_its_reason_on_every_row():
    res = agent.Results()
    agent.run_phases([agent.Phase("ram", 60, agent.RAM_METRICS, "", lambda b, o: None, agent.NO_TORCH)], res)
    assert [r["not_run"] for r in res.rows] == [agent.NO_TORCH] * 4


def test_each_row_is_written_to_the_stream_the_moment_it_is_added():
    stream = io.StringIO()
    res = agent.Results(stream)
    seen: list[int] = []

    def measure(budget, out):
        out.add("ram_copy_gbs", 5.0)
        seen.append(len(stream.getvalue().splitlines()))  # written before the phase ends

    agent.run_phases([agent.Phase("ram", 60, ("ram_copy_gbs",), "", measure)], res)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(d["type"], d.get("state")) for d in lines] == [("phase", "start"), ("row", None), ("phase", "end")]
    assert seen == [2]
    assert lines[1] == {
        "type": "row",
        "metric": "ram_copy_gbs",
        "device": "",
        "value": 5.0,
        "not_run": "",
        "detail": "",
        "phase": "ram",
    }


@pytest.mark.parametrize("phase", ["cpu", "ram", "disk"])
def test_unknown_or_known_budget_flags(phase):
    assert agent._budgets(f"{phase}=3", "quick") == {phase: 3.0}
    with pytest.raises(SystemExit, match="unknown phase"):
        agent._budgets("cpus=3", "quick")


def test_each_gpu_has_its_own_phases_and_the_copies_share_one_budget():
    stand_in = types.SimpleNamespace(cuda=types.SimpleNamespace(device_count=lambda: 3))  # test stand-in: 3 GPUs
    gpus = [{"index": 0}, {"index": 1, "error": "GPU is lost"}, {"index": 2}]
    budgets = agent.BUDGETS_S["quick"]
    groups = agent.gpu_phases(stand_in, agent.MODES["quick"], budgets, gpus)
    names = [[p.name for p in g] for g in groups]
    assert names == [
        ["gpu0 gemm bf16", "gpu2 gemm bf16"],
        ["gpu0 gemm fp16", "gpu2 gemm fp16"],
        ["gpu0 gemm tf32", "gpu2 gemm tf32"],
        ["gpu0 gemm fp32", "gpu2 gemm fp32"],
        ["gpu0 hbm", "gpu2 hbm"],
        ["gpu0 burn", "gpu2 burn"],
        ["gpu0 copies"],
        ["gpu2 copies"],
    ]
    # Side by side within a group, one group after another: the GPU side's time is the sum
    # of the groups' longest budgets, whatever the GPU count.
    assert sum(max(p.budget_s for p in g) for g in groups) == pytest.approx(
        budgets["gemm"] + budgets["hbm"] + budgets["burn"] + budgets["copies"]
    )


def test_a_hung_gpu_costs_only_its_own_phase(monkeypatch):
    monkeypatch.setattr(agent, "GRACE_S", 0)
    release = threading.Event()

    def hung(budget, out):  # a kernel that never returns
        release.wait(30)

    res = agent.Results()
    phases = [
        agent.Phase("gpu0 hbm", 60, ("gpu_hbm_gbs",), "gpu0", lambda b, o: o.add("gpu_hbm_gbs", 4000.0, "gpu0")),
        agent.Phase("gpu1 hbm", 0.01, ("gpu_hbm_gbs",), "gpu1", hung),
    ]
    agent.run_phases(phases, res)
    release.set()
    rows = {r["device"]: r for r in res.rows}
    assert rows["gpu0"]["value"] == 4000.0
    assert rows["gpu1"]["not_run"] == "not run: timed out after 0.01 s (phase gpu1 hbm)"


def test_the_deadline_command_prints_the_outer_deadline_for_a_shell(capsys):
    assert agent.main(["deadline", "--mode", "full", "--budget", "cpu=10"]) == 0
    full = agent.BUDGETS_S["full"]
    assert capsys.readouterr().out == f"{agent.outer_deadline_s('full', {**full, 'cpu': 10})}\n"
