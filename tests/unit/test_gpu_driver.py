"""A host whose NVIDIA driver is broken is never taken for a host without GPUs, and CUDA's
init errors are told apart (CUDA error 802: the fabric manager is not running)."""

from __future__ import annotations

import types
from pathlib import Path

import pynvml
import pytest
import torch

from provision.validate import agent, agent_stream, judge
from tests.helpers.agent_stream import agent_lines


def sysfs(root: Path, devices: dict[str, tuple[str, str]]) -> str:
    """A stand-in /sys/bus/pci/devices: address -> (vendor, class) files."""
    for address, (vendor, cls) in devices.items():
        (root / address).mkdir(parents=True)
        (root / address / "vendor").write_text(vendor + "\n")
        (root / address / "class").write_text(cls + "\n")
    return str(root)


GPU_AND_ITS_AUDIO = {
    "0000:17:00.0": ("0x10de", "0x030200"),  # NVIDIA 3D controller (an H100)
    "0000:17:00.1": ("0x10de", "0x040300"),  # NVIDIA HD audio function: not a GPU
    "0000:00:03.0": ("0x1af4", "0x020000"),  # virtio NIC
}


@pytest.fixture
def pci(monkeypatch, tmp_path):
    """The agent reads the stand-in sysfs; no fio, no nvidia-smi on PATH."""

    def install(devices: dict[str, tuple[str, str]]) -> None:
        root = sysfs(tmp_path / "sys", devices)
        real = agent.nvidia_pci_devices
        monkeypatch.setattr(agent, "nvidia_pci_devices", lambda root_=root: real(root_))

    monkeypatch.setattr(agent.shutil, "which", lambda name: None)
    return install


def judged_node(doc: dict, wants_gpu: bool = False):
    report = agent_stream.agent_output(agent_lines(doc), "n")
    node = judge.NodeInput("n", list(report.measurements), list(report.gpus), wants_gpu, inventory=report.inventory)
    (result,) = judge.judge([node])
    return result


def test_nvidia_pci_devices_are_display_controllers_of_vendor_10de(tmp_path):
    assert agent.nvidia_pci_devices(sysfs(tmp_path, GPU_AND_ITS_AUDIO)) == ["0000:17:00.0"]


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot after a driver upgrade"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "reinstall the NVIDIA driver"),
    ],
)
def test_broken_driver_fails_a_host_outside_gpu_nodes(stand_in_nvml, pci, tmp_path, error, hint):
    stand_in_nvml("h100-sxm", init_error=error)
    pci(GPU_AND_ITS_AUDIO)
    doc = agent.run("quick", {"gpu"}, str(tmp_path))
    reasons = {r["not_run"] for r in doc["results"]}
    (reason,) = reasons
    assert reason.startswith("not run: gpu inventory: BrokenDriver: NVIDIA GPU at 0000:17:00.0 but NVML failed")
    assert hint in reason
    result = judged_node(doc, wants_gpu=False)
    assert result.verdict == "fail"
    assert {f.verdict for f in result.findings} == {"fail"}


def test_host_without_nvidia_devices_is_still_no_gpu_and_passes(stand_in_nvml, pci, tmp_path):
    stand_in_nvml(None)  # no libnvidia-ml.so.1 at all
    pci({"0000:00:03.0": ("0x1af4", "0x020000")})
    doc = agent.run("quick", {"gpu"}, str(tmp_path))
    assert {r["not_run"] for r in doc["results"]} == {agent.NO_GPU}
    assert judged_node(doc).verdict == "pass"
    assert judged_node(doc, wants_gpu=True).verdict == "fail"  # in gpu_nodes, no GPU still fails


# --- torch's CUDA: why it sees no device ---------------------------------------------------

# torch's own message when cudaGetDeviceCount fails (c10/cuda/CUDAFunctions.cpp), with the
# CUDA runtime's text for cudaErrorSystemNotReady (802).
CUDA_802 = (
    "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
    "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized"
)


class StandInTorchCuda:
    """Test stand-in for torch where CUDA does not come up; the names are real torch's."""

    def __init__(self, cuda_version: str | None, init_error: str = "") -> None:
        self.version = types.SimpleNamespace(cuda=cuda_version)
        self.cuda = types.SimpleNamespace(is_available=lambda: False, init=self._init, device_count=lambda: 0)
        self.init_error = init_error

    def _init(self) -> None:
        raise RuntimeError(self.init_error)


def test_the_stand_in_uses_real_torch_names():
    assert hasattr(torch.version, "cuda")
    assert callable(torch.cuda.init)
    assert callable(torch.cuda.is_available)


def no_cuda_reasons(stand_in: StandInTorchCuda) -> set[str]:
    res = agent.Results()
    gpus = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "mig_mode": "disabled"}]
    agent._gpu_steps(stand_in, "", agent.MODES["quick"], (gpus, "", agent.NO_GPU), {"gpu"}, res)
    return {r["not_run"] for r in res.rows}


def test_cuda_error_802_says_the_fabric_manager_is_not_running():
    (reason,) = no_cuda_reasons(StandInTorchCuda("12.8", CUDA_802))
    assert reason.startswith("not run: fabric manager is not running (CUDA error 802")
    assert "CPU-only" not in reason


def test_cpu_only_torch_build_is_named_as_such():
    (reason,) = no_cuda_reasons(StandInTorchCuda(None))
    assert "CPU-only torch build" in reason


def test_another_cuda_init_error_is_quoted():
    error = "CUDA driver version is insufficient for CUDA runtime version"
    (reason,) = no_cuda_reasons(StandInTorchCuda("12.8", error))
    assert reason.endswith(f"CUDA init failed: {error}")
