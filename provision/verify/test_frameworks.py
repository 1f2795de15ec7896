"""The frameworks venv: torch at the pinned version imports, numpy, nvidia-ml-py and
tensorboard are at their pins; on GPU hosts torch sees CUDA."""

from __future__ import annotations

from typing import Any

import pytest


def test_venv_imports_pinned_torch_numpy_nvml(host: Any, settings: dict[str, Any]) -> None:
    python = f"{settings['venv_path']}/bin/python"
    out = host.check_output(f"{python} -c 'import torch, numpy, pynvml; print(torch.__version__)'")
    assert out.strip().split("+")[0] == settings["torch_version"]


@pytest.mark.parametrize(
    ("package", "knob"),
    [("numpy", "numpy_version"), ("nvidia-ml-py", "nvml_version"), ("tensorboard", "tensorboard_version")],
)
def test_venv_package_is_at_its_pin(host: Any, settings: dict[str, Any], package: str, knob: str) -> None:
    if not settings[knob]:
        pytest.skip(f"{knob} is null: {package} is not pinned")
    python = f"{settings['venv_path']}/bin/python"
    script = f"from importlib.metadata import version; print(version({package!r}))"
    assert host.check_output(f'{python} -c "{script}"').strip() == settings[knob]


def test_torch_sees_cuda_on_gpu_hosts(host: Any, settings: dict[str, Any]) -> None:
    if "[10de:" not in host.run("lspci -nn 2>/dev/null || true").stdout:
        pytest.skip("no NVIDIA GPU on this host: nothing for CUDA to see")
    python = f"{settings['venv_path']}/bin/python"
    assert host.check_output(f"{python} -c 'import torch; print(torch.cuda.is_available())'").strip() == "True"


def test_venv_python_has_its_headers_for_triton(host: Any, settings: dict[str, Any]) -> None:
    # Triton compiles a C launcher against Python.h the first time a compiled kernel runs
    # (`train --compile`); the base step's python3-dev provides it for the system python.
    python = f"{settings['venv_path']}/bin/python"
    include = host.check_output(f"{python} -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'")
    assert host.file(f"{include.strip()}/Python.h").exists
