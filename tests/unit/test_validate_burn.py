"""The agent's time-based GPU burn, on stand-ins for torch's CUDA calls and for NVML.

No GPU here: the stand-in runs the burn's matmuls on CPU tensors of the real torch, and
every name it offers is asserted to exist on the real ``torch`` / ``torch.cuda``, so a typo
in the agent cannot pass here and fail on the first GPU. NVML is the real pynvml module over
captured values (tests/standins/nvml_from_captures.py); tests/unit/test_nvml_names.py holds
every NVML name agent.py uses to the installed nvidia-ml-py. A stand-in clock moves
only when a matmul runs, so throughput and repetition counts are exact."""

from __future__ import annotations

import contextlib
import types
from dataclasses import replace

import pynvml
import pytest
import torch

from provision.validate import agent


class StandInClock:
    """A clock for Budget that moves only when told (by the stand-in GPU's matmuls)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StandInCudaTorch:
    """Test stand-in for the torch names the burn uses, on CPU tensors of the real torch.

    ``seconds_per_mm(k)``: how long the k-th matmul takes on the stand-in clock;
    ``corrupt``: matmul indices whose result gets one element changed (a marginal GPU)."""

    TORCH_NAMES = ("bfloat16", "int32", "Generator", "randn", "mm", "equal", "empty", "empty_like", "backends")
    CUDA_NAMES = ("device", "empty_cache", "device_count", "Event", "get_device_properties", "synchronize")

    def __init__(self, clock: StandInClock, seconds_per_mm, corrupt: frozenset[int] = frozenset()) -> None:
        self.clock, self.seconds_per_mm, self.corrupt = clock, seconds_per_mm, corrupt
        self.mms = 0
        self.bfloat16, self.int32 = torch.bfloat16, torch.int32
        self.equal, self.empty_like = torch.equal, torch.empty_like
        self.cuda = types.SimpleNamespace(
            device=self._device,
            empty_cache=lambda: None,
            device_count=lambda: 1,
            Event=lambda enable_timing=False: StandInEvent(clock),
            get_device_properties=lambda i: types.SimpleNamespace(L2_cache_size=1 << 12),
            synchronize=lambda i=None: None,
        )
        matmul = types.SimpleNamespace(allow_tf32=False)
        self.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=matmul), cudnn=types.SimpleNamespace())

    def empty(self, *size, dtype, device):
        return torch.empty(*size, dtype=dtype)

    def Generator(self, device: str) -> torch.Generator:
        assert device.startswith("cuda:")
        return torch.Generator()

    def randn(self, *size, device, dtype, generator=None):
        return torch.randn(*size, dtype=dtype, generator=generator)

    def mm(self, a, b, out=None):
        result = torch.mm(a, b, out=out)
        if self.mms in self.corrupt:
            result.view(-1)[0] += 1
        self.clock.now += self.seconds_per_mm(self.mms)
        self.mms += 1
        return result

    @contextlib.contextmanager
    def _device(self, i):
        yield


class StandInEvent:
    """Test stand-in for torch.cuda.Event: records the stand-in clock."""

    NAMES = ("record", "synchronize", "elapsed_time")

    def __init__(self, clock: StandInClock) -> None:
        self.clock, self.at = clock, 0.0

    def record(self):
        self.at = self.clock()

    def synchronize(self):
        pass

    def elapsed_time(self, end: StandInEvent) -> float:
        return (end.at - self.at) * 1000  # milliseconds, as CUDA events give them


def test_stand_in_names_are_real_torch_and_torch_cuda_names():
    for name in StandInCudaTorch.TORCH_NAMES:
        assert hasattr(torch, name), name
    for name in StandInCudaTorch.CUDA_NAMES:
        assert hasattr(torch.cuda, name), name
    for name in StandInEvent.NAMES:
        assert hasattr(torch.cuda.Event, name), name
    assert hasattr(torch.backends.cuda.matmul, "allow_tf32")
    assert hasattr(torch.backends.cudnn, "allow_tf32")


def burn(gpu: StandInCudaTorch, clock: StandInClock, burn_s: float = 10) -> dict[str, dict]:
    res = agent.Results()
    cfg = {"burn_n": 16, "burn_s": burn_s}
    agent._burn(gpu, cfg, 0, agent.Budget(burn_s + agent.GRACE_S, clock), agent.Sink(res, "gpu0 burn"))
    return {r["metric"]: r for r in res.rows}


def test_burn_runs_for_its_time_not_a_count_and_a_steady_gpu_holds_its_throughput(stand_in_nvml):
    stand_in_nvml(None)  # no NVML on this node
    clock = StandInClock()
    rows = burn(StandInCudaTorch(clock, lambda k: 0.125), clock)
    assert rows["gpu_burn_mismatches"]["value"] == 0.0
    # 10 s of 0.125 s GEMMs, after the reference result's own GEMM
    assert rows["gpu_burn_mismatches"]["detail"].startswith("79 x 16^3 bf16 GEMMs in 10.0 s")
    assert abs(rows["gpu_burn_throughput_ratio"]["value"] - 1.0) < 1e-6
    assert "gpu_hw_slowdown" not in rows  # no NVML: nothing sampled, the inventory's reading stands


def test_burn_counts_results_that_differ_bitwise_from_the_first(stand_in_nvml):
    stand_in_nvml("h200")
    clock = StandInClock()
    rows = burn(StandInCudaTorch(clock, lambda k: 0.125, frozenset({7, 30})), clock)
    assert rows["gpu_burn_mismatches"]["value"] == 2.0


def test_burn_compares_the_last_windows_throughput_with_the_first(stand_in_nvml):
    stand_in_nvml("h200")
    clock = StandInClock()
    heats_up = StandInCudaTorch(clock, lambda k: 0.125 if k < 40 else 0.25)  # half as fast after 5 s
    rows = burn(heats_up, clock)
    assert rows["gpu_burn_throughput_ratio"]["value"] == pytest.approx(0.5)
    assert "5 windows" in rows["gpu_burn_throughput_ratio"]["detail"]


def test_burn_samples_nvml_and_counts_a_hardware_slowdown_only_when_seen_twice(stand_in_nvml):
    """The real pynvml over captured H200 values: HW slowdown (0x8) in the first sample only,
    HW thermal slowdown (0x40) in every sample."""
    thermal, slowdown = pynvml.nvmlClocksEventReasonHwThermalSlowdown, pynvml.nvmlClocksEventReasonHwSlowdown
    library = stand_in_nvml("h200", clock_reasons=thermal | slowdown, power_mw=None)
    first = library.capture.gpus[0]

    def cools_down_after_the_first_sample(k: int) -> float:
        if k == 0:  # the reference GEMM: the burn's first NVML sample is already taken
            library.capture.gpus[0] = replace(first, clock_reasons=thermal)
        return 0.125

    clock = StandInClock()
    rows = burn(StandInCudaTorch(clock, cools_down_after_the_first_sample), clock)
    slowdown_row = rows["gpu_hw_slowdown"]
    assert slowdown_row["value"] == 1.0
    assert "hardware slowdown in more than one sample: hw_thermal_slowdown" in slowdown_row["detail"]
    assert "reasons seen: hw_slowdown, hw_thermal_slowdown" in slowdown_row["detail"]
    assert f"sm {first.sm_clock}-{first.sm_clock} MHz" in slowdown_row["detail"]
    assert "power n/a" in slowdown_row["detail"]  # no power reading (power_mw=None): N/A, not a crash
    assert library.called("nvmlDeviceGetCurrentClocksEventReasons") >= 2  # one read at each end at least


def test_a_burn_shorter_than_two_windows_says_so():
    stats = agent.BurnStats(reps=1, seconds=0.1, windows=[10.0])
    res = agent.Results()
    agent._burn_rows(0, 16, stats, agent.Telemetry(0), agent.Sink(res, "gpu0 burn"))
    ratio = next(r for r in res.rows if r["metric"] == "gpu_burn_throughput_ratio")
    assert ratio["not_run"] == "not run: burn too short for two windows (1 GEMMs)"


def test_quick_burn_lasts_about_15_s_and_full_between_60_and_120():
    assert agent.MODES["quick"]["burn_s"] == 15
    assert 60 <= agent.MODES["full"]["burn_s"] <= 120
    for mode in ("quick", "full"):
        assert agent.BUDGETS_S[mode]["burn"] >= agent.MODES[mode]["burn_s"] + agent.GRACE_S


def gemm(gpu: StandInCudaTorch, clock: StandInClock, seconds: float) -> dict:
    res = agent.Results()
    cfg = {"gemm_shapes": [(32, 32, 32), (64, 32, 32), (32, 64, 32)], "gemm_iters": 10}
    agent._gemm(gpu, cfg, 0, agent.GEMM_DTYPES[0], agent.Budget(seconds, clock), agent.Sink(res, "gpu0 gemm bf16"))
    (row,) = res.rows
    return row


def test_gemm_shapes_share_the_budget_and_each_stops_at_its_share():
    clock = StandInClock()
    # Each shape gets an equal share of what is left (4 s, then 4.5 s, then 5 s), spends 1 s on
    # its warm-up and stops a rep before it would end past its share: 2 + 3 + 3 reps.
    row = gemm(StandInCudaTorch(clock, lambda k: 1.0), clock, 12)
    assert row["detail"] == "best shape (64, 32, 32), 3 of 3 shapes, 8 reps"
    assert row["value"] == pytest.approx(2 * 64 * 32 * 32 / 1.0 / 1e12)


def test_gemm_preheats_the_gpu_on_its_first_shape_warms_each_other_and_spends_at_most_a_third_of_a_share():
    clock = StandInClock()
    gpu = StandInCudaTorch(clock, lambda k: 0.1)
    res = agent.Results()
    cfg = {"gemm_shapes": [(32, 32, 32), (64, 32, 32)], "gemm_iters": 10, "gemm_preheat_s": 1.0, "gemm_warmup_s": 0.2}
    agent._gemm(gpu, cfg, 0, agent.GEMM_DTYPES[0], agent.Budget(30, clock), agent.Sink(res, "gpu0 gemm bf16"))
    # First shape: one call for cuBLAS's choice, then rounds of 4 until 1 s has passed (0.1 s
    # each): 13, then 10 timed reps. Second: 1 + 4 (0.5 s >= 0.2 s), then 10.
    assert gpu.mms == (13 + 10) + (5 + 10)
    assert "20 reps" in res.rows[0]["detail"]
    # A short share: the pre-heat stops at a third of it (0.5 s of 1.5 s), the reps get the rest.
    clock, res = StandInClock(), agent.Results()
    gpu = StandInCudaTorch(clock, lambda k: 0.1)
    cfg = {"gemm_shapes": [(32, 32, 32)], "gemm_iters": 10, "gemm_preheat_s": 5.0}
    agent._gemm(gpu, cfg, 0, agent.GEMM_DTYPES[0], agent.Budget(1.5, clock), agent.Sink(res, "gpu0 gemm bf16"))
    assert gpu.mms - int(res.rows[0]["detail"].split(", ")[-1].split()[0]) == 5
    assert res.rows[0]["value"] is not None


def test_gemm_on_a_short_budget_says_which_shapes_it_reached():
    clock = StandInClock()
    row = gemm(StandInCudaTorch(clock, lambda k: 1.0), clock, 5)  # the third shape's share ends in its warm-up
    assert row["detail"] == "best shape (64, 32, 32), 2 of 3 shapes (5 s budget reached), 2 reps"


def test_gemm_with_no_time_for_one_rep_says_so_instead_of_a_value():
    clock = StandInClock()
    row = gemm(StandInCudaTorch(clock, lambda k: 10.0), clock, 3)
    assert row["value"] is None
    assert row["not_run"] == "not run: no GEMM fitted in the 3 s budget"
