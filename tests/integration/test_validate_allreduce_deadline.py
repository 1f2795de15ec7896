"""validate's in-node all-reduce at its deadline: ranks that hang (as a rank stuck in NCCL
does, ignoring SIGTERM) are stopped and reaped, and the phase reports a timeout row.

Real processes (torch.multiprocessing's spawn, as on a GPU node); the only stand-in is
the device count: this machine has no GPU, so the torch handed to the phase says two."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from provision.validate import agent
from tests.helpers.hung_rank import hung_rank


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_hung_allreduce_ranks_are_killed_at_the_budget_and_the_phase_says_it_timed_out(tmp_path, monkeypatch):
    monkeypatch.setenv("HUNG_RANK_PIDS", str(tmp_path))
    stand_in_torch_with_two_gpus = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 2))
    res = agent.Results()
    sink = agent.Sink(res, "allreduce")
    start = time.monotonic()
    agent.bench_allreduce_local(
        stand_in_torch_with_two_gpus, {"allreduce_mb": 8}, agent.Budget(20.0), sink, rank_main=hung_rank
    )
    took = time.monotonic() - start
    (row,) = res.rows
    assert row["metric"] == "gpu_allreduce_busbw_gbs"
    assert row["value"] is None
    assert row["not_run"] == "not run: timed out after 20 s (phase allreduce)"
    # It returned at its budget plus the stop's grace, not when the ranks' sleep ended.
    assert took < 20.0 + 2 * agent.RANK_STOP_S + 5
    pids = [int((tmp_path / str(rank)).read_text()) for rank in range(2)]
    assert not [pid for pid in pids if _alive(pid)]  # both ranks gone, SIGTERM ignored or not
