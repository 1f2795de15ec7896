"""Pure helpers of the node agent (the agent itself runs in tests/integration)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types
from dataclasses import replace

import pynvml
import pytest

from provision.validate import agent
from tests.standins import nvml_from_captures as nvml


def budget_and_sink(res: agent.Results, seconds: float = 600) -> tuple[agent.Budget, agent.Sink]:
    return agent.Budget(seconds), agent.Sink(res, "test")


def test_cpulist_expands_ranges():
    assert agent._cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_isa_prefers_widest_vector_unit():
    assert agent._isa({"avx512f", "avx2", "fma", "sse2"})["fp32_flops_per_cycle"] == 64
    assert agent._isa({"avx2", "fma", "avx", "sse2"})["best"] == "avx2+fma"
    assert agent._isa({"avx2", "avx", "sse2"})["best"] == "avx"  # AVX2 without FMA
    assert agent._isa(set())["best"] == "scalar"


def test_zen4_avx512_counts_as_256_bit_units_and_zen5_as_512():
    zen4 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
    zen5 = "vendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
    intel = "vendor_id\t: GenuineIntel\ncpu family\t: 6\n"
    flags = {"avx512f", "avx2", "fma", "sse2"}
    assert agent._isa(flags, agent._amd_family(zen4))["fp32_flops_per_cycle"] == 32
    assert agent._isa(flags, agent._amd_family(zen5))["fp32_flops_per_cycle"] == 64
    assert agent._isa(flags, agent._amd_family(intel))["fp32_flops_per_cycle"] == 64
    assert agent._amd_family(intel) is None


def test_cpu_gemm_uses_one_thread_per_core_and_grows_with_the_cores():
    import torch

    res = agent.Results()
    cpu = {"cores": 1, "threads": 2, "ghz": None, "isa": agent._isa(set())}
    before = torch.get_num_threads()
    try:
        agent.bench_cpu(torch, {"cpu_n": 256, "cpu_reps": 1}, cpu, agent.Budget(600), agent.Sink(res, "cpu"))
        assert torch.get_num_threads() == 1  # not the 2 hyper-threads
    finally:
        torch.set_num_threads(before)
    row = next(r for r in res.rows if r["metric"] == "cpu_gemm_gflops")
    assert row["detail"] == "n=256, 1 threads, best of 1 reps"


def test_cpu_peak_counts_physical_cores_only():
    cpu = {"cores": 8, "threads": 16, "ghz": 2.0, "isa": {"fp32_flops_per_cycle": 32}}
    assert agent._cpu_peak_gflops(cpu) == 8 * 2.0 * 32


def test_stream_arrays_are_four_times_the_llc_and_bounded_by_ram():
    assert agent._stream_elements(256 << 20, None) == 4 * (256 << 20) // 8
    assert agent._stream_elements(1 << 20, None) == 16 << 20  # floor of 16M doubles
    assert agent._stream_elements(256 << 20, 8 << 30) == (8 << 30) // 8 // 24


def test_fio_jobfile_runs_three_bounded_jobs_on_a_file():
    text = agent.fio_jobfile("/data/.x/fio.dat", "512M", 3, direct=True)
    assert "filename=/data/.x/fio.dat" in text
    assert "direct=1" in text
    assert "runtime=3" in text
    assert "time_based=1" in text
    assert [line for line in text.splitlines() if line.startswith("[")] == [
        "[global]",
        "[seq_write]",
        "[seq_read]",
        "[rand_read]",
    ]
    assert text.count("stonewall") == 3
    assert "rw=randread\nbs=4k" in text


def test_throttle_bits_name_only_real_slowdowns():
    assert agent._throttle_names(0x1 | 0x2 | 0x40) == ["hw_thermal_slowdown"]  # idle, app clocks
    assert agent._throttle_names(0x8 | 0x80) == ["hw_slowdown", "hw_power_brake_slowdown"]


def test_pci_numa_reads_nothing_for_unknown_bus():
    assert agent._pci_numa("00000000:FF:1F.7") is None


# --- GPU paths, on test stand-ins (this machine has no GPU) ---------------------------------


def test_lost_gpu_is_listed_with_its_nvml_error_and_the_others_are_kept(stand_in_nvml):
    library = nvml.stand_in_library("rtx-a5000-x2")
    library.capture.gpus[1] = replace(library.capture.gpus[1], lost=True)  # fell off the bus
    stand_in_nvml(library)
    gpus, xml, why = agent.gpu_inventory()
    assert [g["index"] for g in gpus] == [0, 1]
    assert xml == ""
    assert why == ""
    assert gpus[1] == {"index": 1, "error": "NVMLError_GpuIsLost: GPU is lost"}
    assert gpus[0]["name"] == "NVIDIA RTX A5000"
    assert gpus[0]["cuda_version"] == "13.1"
    assert library.started == 0  # NVML shut down again


def test_lost_gpu_gets_not_run_rows_naming_the_nvml_error():
    res = agent.Results()
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}, {"index": 1, "error": "NVMLError_GpuIsLost: GPU is lost"}]
    agent._gpu_steps(None, agent.NO_TORCH, agent.MODES["quick"], (gpus, "", agent.NO_GPU), {"gpu"}, res)
    lost = [r for r in res.rows if r["device"] == "gpu1"]
    assert {r["metric"] for r in lost} == set(agent.GPU_METRICS)
    assert all("NVML cannot read gpu1: NVMLError_GpuIsLost" in r["not_run"] for r in lost)


class StandInNvmlCountFails(nvml.StandInNvmlLibrary):
    """Test stand-in: NVML starts, then cannot even count the GPUs."""

    def c_nvmlDeviceGetCount_v2(self, ref):
        return pynvml.NVML_ERROR_UNKNOWN


def test_nvml_failing_after_init_keeps_every_other_metric(monkeypatch, tmp_path, stand_in_nvml):
    stand_in_nvml(StandInNvmlCountFails(nvml.load_capture("h100-sxm")))
    monkeypatch.setattr(agent.shutil, "which", lambda name: None)  # no fio: the disk step answers at once
    doc = agent.run("quick", {"disk", "gpu"}, str(tmp_path))
    rows = {(r["metric"], r["device"]): r for r in doc["results"]}
    assert "fio missing" in rows[("disk_seq_read_mibs", "")]["not_run"]
    gpu = rows[("gpu_bf16_tflops", "")]["not_run"]
    assert gpu.startswith("not run: gpu inventory: NVMLError_Unknown")
    assert gpu != agent.NO_GPU
    assert doc["inventory"]["cpu"]["threads"] >= 1


class StandInTorch:
    """Test stand-in for the parts of torch the agent's host copies use. Pinned blocks come
    from a stand-in of torch's caching host allocator: a freed block is cached and handed
    back to the next pinned allocation until _C._host_emptyCache() drops the cache. A new
    block's pages land on the NUMA node of the CPUs the allocating thread may run on."""

    uint8 = "uint8"

    def __init__(self, affinity: list[set[int]], cpus_of_node: dict[int, set[int]], with_empty_cache: bool = True):
        self.affinity, self.cpus_of_node = affinity, cpus_of_node
        self.cached: list[int] = []  # NUMA nodes of the free cached pinned blocks
        self.copies: list[tuple[int, int]] = []  # (GPU, NUMA node of the host block) per copy
        self.busy = False  # host copies queued and not yet synchronized
        # Set by a stand-in NVML once it has read the link while copies were queued: the
        # copies then last until that read (at most 10 s), however slowly a loaded machine
        # schedules the poll thread. Code that never polls during the copies still fails.
        self.link_read_while_busy: threading.Event | None = None
        self.cuda = types.SimpleNamespace(device=self._device, synchronize=self._synchronize, Event=self._event)
        self._C = types.SimpleNamespace(_host_emptyCache=self.cached.clear) if with_empty_cache else object()
        self._current = 0

    def empty(self, n, dtype=None, pin_memory=False, device=None):
        if not pin_memory:
            return StandInTensor(self, None, device)
        if self.cached:
            return StandInTensor(self, self.cached.pop(), None)
        node = next(k for k, cpus in self.cpus_of_node.items() if self.affinity[-1] <= cpus)
        return StandInTensor(self, node, None)

    @contextlib.contextmanager
    def _device(self, i):
        self._current = i
        yield

    def _synchronize(self, i=None):
        if self.busy and self.link_read_while_busy is not None:
            self.link_read_while_busy.wait(10)
        else:
            time.sleep(0.05)  # the queued copies take a while on a real GPU
        self.busy = False

    def _event(self):
        return types.SimpleNamespace(record=lambda: None, synchronize=self._synchronize)


class StandInTensor:
    """Test stand-in for a torch tensor: pinned host memory (``node`` set) or GPU memory."""

    def __init__(self, torch: StandInTorch, node: int | None, device: int | None):
        self.torch, self.node, self.device = torch, node, device

    def fill_(self, value):
        return self

    def copy_(self, other, non_blocking=False):
        host = other if self.device is not None else self
        self.torch.copies.append((self.torch._current, host.node))
        self.torch.busy = True
        return self

    def __del__(self):
        if self.node is not None:
            self.torch.cached.append(self.node)


@pytest.fixture
def two_numa_nodes(monkeypatch):
    """Affinity calls recorded on a stand-in two-node machine; CUDA timing stubbed out."""
    cpus_of_node = {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    affinity = [set(range(8))]
    monkeypatch.setattr(agent, "_read", lambda path: {0: "0-3", 1: "4-7"}.get(int(path.split("node")[-1][0]), ""))
    monkeypatch.setattr(agent.os, "sched_getaffinity", lambda pid: affinity[-1])
    monkeypatch.setattr(agent.os, "sched_setaffinity", lambda pid, cpus: affinity.append(set(cpus)))
    monkeypatch.setattr(agent, "_timed", lambda torch, dev, fn, iters, budget, before=None: (fn(), (0.01, iters))[1])
    return affinity, cpus_of_node


def test_each_gpu_copies_from_pinned_memory_on_its_own_numa_node(monkeypatch, two_numa_nodes):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: the link is not read here
    torch = StandInTorch(*two_numa_nodes)
    res = agent.Results()
    for i in (0, 1):
        agent._host_copies(torch, agent.MODES["quick"], i, {"index": i, "numa_node": i}, *budget_and_sink(res))
    assert {node for gpu, node in torch.copies if gpu == 1} == {1}
    assert {node for gpu, node in torch.copies if gpu == 0} == {0}
    assert [r["detail"] for r in res.rows if r["metric"] == "gpu_h2d_gbs"] == [
        "pinned on NUMA node 0, best of 10 reps",
        "pinned on NUMA node 1, best of 10 reps",
    ]


def test_host_copies_run_on_a_torch_without_host_empty_cache(monkeypatch, two_numa_nodes):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    torch = StandInTorch(*two_numa_nodes, with_empty_cache=False)
    res = agent.Results()
    agent._host_copies(torch, agent.MODES["quick"], 0, {"index": 0, "numa_node": 0}, *budget_and_sink(res))
    assert {r["metric"] for r in res.rows} == {"gpu_h2d_gbs", "gpu_d2h_gbs"}


class StandInNvmlLinkTrainsDown(nvml.StandInNvmlLibrary):
    """Test stand-in: the captured H100, whose link reads gen 5 x16 only while copies run
    (an idle link trains down to gen 1 x4), and whose init takes long enough for queued
    copies to finish meanwhile."""

    def __init__(self, torch):
        super().__init__(nvml.load_capture("h100-sxm"))
        self.torch = torch
        torch.link_read_while_busy = threading.Event()
        self.gen_read_busy = False

    def c_nvmlInitWithFlags(self, flags):
        self.torch.busy = False
        return super().c_nvmlInitWithFlags(flags)

    def c_nvmlDeviceGetCurrPcieLinkGeneration(self, h, ref):
        self.gen_read_busy = self.torch.busy
        return nvml._set(ref, 5 if self.torch.busy else 1)

    def c_nvmlDeviceGetCurrPcieLinkWidth(self, h, ref):
        if not self.torch.busy:
            return nvml._set(ref, 4)
        result = nvml._set(ref, 16)
        if self.gen_read_busy:  # generation and width were both read while busy
            self.torch.link_read_while_busy.set()
        return result


def test_pcie_link_is_polled_while_the_copies_run(two_numa_nodes, stand_in_nvml):
    torch = StandInTorch(*two_numa_nodes)
    library = stand_in_nvml(StandInNvmlLinkTrainsDown(torch))
    res = agent.Results()
    agent._host_copies(torch, agent.MODES["quick"], 0, {"index": 0, "numa_node": 0}, *budget_and_sink(res))
    link = {r["metric"]: r["value"] for r in res.rows if r["metric"].startswith("gpu_pcie")}
    assert link == {"gpu_pcie_gen": 5.0, "gpu_pcie_width": 16.0}
    assert library.started == 0


def test_gpu_counts_of_nvml_and_cuda_are_reported(monkeypatch):
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 7)
    torch = types.SimpleNamespace(cuda=cuda)  # test stand-in: CUDA sees 7 GPUs
    monkeypatch.setattr(agent, "gpu_phases", lambda *args: [])
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(8)]
    counts, _ = agent._gpu_steps(torch, "", agent.MODES["quick"], (gpus, "", agent.NO_GPU), {"gpu"}, agent.Results())
    assert counts == {"nvml": 8, "cuda": 7}


# --- disk: only on the mounted data volume ---------------------------------------------------


def fio_stand_in(calls: list):
    """Test stand-in for _run_fio: records the call and returns a tiny fio report."""

    def run_fio(workdir, plan, budget):
        calls.append(workdir)
        job = {"read": {"bw_bytes": 2**20, "iops": 10.0}, "write": {"bw_bytes": 2**20, "iops": 10.0}}
        return {"jobs": [{"jobname": n, **job} for n in ("seq_write", "seq_read", "rand_read")]}, True

    return run_fio


def test_disk_is_not_run_when_the_data_volume_in_fstab_is_not_mounted(monkeypatch, tmp_path):
    fstab = f"# comment\nUUID=1 / ext4 defaults 0 1\nUUID=2 {tmp_path} xfs defaults,noatime,nofail 0 2\n"
    monkeypatch.setattr(agent, "_read", lambda path: fstab if path == "/etc/fstab" else "")
    monkeypatch.setattr(agent.shutil, "which", lambda name: "/usr/bin/fio")
    calls: list = []
    monkeypatch.setattr(agent, "_run_fio", fio_stand_in(calls))
    res = agent.Results()
    agent.bench_disk(agent.MODES["quick"], str(tmp_path), *budget_and_sink(res))
    assert calls == []  # fio would have measured the root disk
    want = f"not run: {tmp_path} is not mounted (the volumes step of provision up makes it)"
    assert [r["not_run"] for r in res.rows] == [want] * 3


def test_disk_runs_in_a_directory_no_volume_is_meant_for(monkeypatch, tmp_path):
    monkeypatch.setattr(agent, "_read", lambda path: "UUID=1 / ext4 defaults 0 1\n" if path == "/etc/fstab" else "")
    monkeypatch.setattr(agent.shutil, "which", lambda name: "/usr/bin/fio")
    calls: list = []
    monkeypatch.setattr(agent, "_run_fio", fio_stand_in(calls))
    res = agent.Results()
    agent.bench_disk(agent.MODES["quick"], str(tmp_path), *budget_and_sink(res))
    assert len(calls) == 1
    assert all(r["value"] == 1.0 for r in res.rows if r["metric"].endswith("mibs"))


def test_fstab_mount_points_skip_comments_and_decode_spaces():
    text = "# /data is ours\nUUID=1 /my\\040data xfs nofail 0 2\nUUID=2 none swap sw 0 0\n"
    assert agent._fstab_mount_points(text) == ["/my data"]


def test_gpu_phase_that_raises_leaves_a_reason_on_every_metric_it_owes_even_after_earlier_rows():
    res = agent.Results()
    res.skip(agent.GPU_METRICS, "not run: NVML cannot read gpu1: lost", "gpu1")  # earlier rows, other GPU

    def bench_raises(budget, out):
        out.add("gpu_hbm_gbs", 2000.0, "gpu0")
        raise RuntimeError("CUDA error: unspecified launch failure")

    owed = ("gpu_hbm_gbs", "gpu_burn_mismatches", "gpu_burn_throughput_ratio")
    agent.run_phases([agent.Phase("gpu0 burn", 60, owed, "gpu0", bench_raises)], res)
    gpu0 = {r["metric"]: r for r in res.rows if r["device"] == "gpu0"}
    assert gpu0["gpu_hbm_gbs"]["value"] == 2000.0
    for metric in owed[1:]:
        assert gpu0[metric]["not_run"].startswith("not run: gpu0 burn: RuntimeError: CUDA error")
