"""Every NVML name the agent and the trainer use exists in the pinned nvidia-ml-py, and the
NVML stand-in answers like the real library for names it lacks."""

from __future__ import annotations

import ast
from pathlib import Path

import pynvml
import pytest

from tests.standins import nvml_from_captures as nvml

ROOT = Path(__file__).resolve().parents[2]
USERS = ("provision/validate/agent.py", "training/train_ddp.py")


def nvml_names(path: Path) -> set[str]:
    """Attribute names that look like NVML's (``x.nvmlFoo``, ``x.NVML_FOO``) in a file."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr.startswith(("nvml", "NVML_"))
    }


def test_the_scan_finds_the_names_the_agent_reads():
    names = nvml_names(ROOT / "provision/validate/agent.py")
    assert {"nvmlInit", "nvmlDeviceGetRemappedRows", "NVML_AGGREGATE_ECC"} <= names


def test_the_installed_nvidia_ml_py_is_the_one_the_nodes_are_pinned_to():
    # The names below are checked against the installed module; it must be the version
    # `up` installs on the nodes (settings.nvml_version), which pyproject.toml pins too.
    from importlib.metadata import version

    from provision.settings import Settings

    assert version("nvidia-ml-py") == Settings().nvml_version


@pytest.mark.parametrize("user", USERS)
def test_every_nvml_name_used_exists_in_the_pinned_nvidia_ml_py(user):
    missing = sorted(name for name in nvml_names(ROOT / user) if not hasattr(pynvml, name))
    assert missing == [], f"{user} uses names nvidia-ml-py does not define: {missing}"


def test_a_function_the_real_library_lacks_raises_function_not_found(stand_in_nvml):
    stand_in_nvml("h100-sxm")
    pynvml.nvmlInit()
    try:
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml._nvmlGetFunctionPointer("nvmlDeviceGetNoSuchCounter")
        # exported by libnvidia-ml.so.1, but the capture has no value for it
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()


def test_the_stand_in_is_removed_after_use():
    before = (pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache)
    with nvml.installed(nvml.stand_in_library("t4")) as library:
        assert pynvml.nvmlLib is library
    assert (pynvml.nvmlLib, pynvml._nvmlGetFunctionPointer_cache) == before


def test_the_stand_in_knows_the_real_library_symbols():
    symbols = nvml.real_library_symbols()
    assert {"nvmlDeviceGetSramEccErrorStatus", "nvmlDeviceGetComputeRunningProcesses_v3"} <= symbols
    assert "nvmlDeviceGetNoSuchCounter" not in symbols
