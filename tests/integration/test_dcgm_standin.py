"""The DCGM stand-ins (tests/standins/nvidia_repo/dcgm.py) run here as the testbed's VMs run
them, against provision's own field list and command lines: what the e2e test's DCGM
series come from. The host engine takes exactly provision's options; the exporter serves
every field provision asks for that the captured GPU has, labelled as dcgm-exporter labels
them, refuses a field DCGM does not have, and serves nothing while the host engine is gone."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.rules import dcgm as dcgm_fields
from provision.rules import monitoring
from tests.helpers.loopback_sshd import free_port
from tests.standins.nvidia_repo import dcgm

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The stand-in packages' files, unpacked under tmp_path as they land under /."""
    for pkg in dcgm.packages():
        for path, text in pkg.files.items():
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755 if path in pkg.executable else 0o644)
    return tmp_path


def _argv(root: Path, binary: str, args: list[str]) -> list[str]:
    # The scripts' #! is the system python3; the suite's interpreter runs them the same way.
    return [sys.executable, str(root / "usr" / "bin" / binary), *args]


def _engine_args(port: int, account: str = ME) -> list[str]:
    args = monitoring.dcgm_args()
    args[args.index("nvidia-dcgm")] = account  # the account the package's postinst makes
    args[args.index(str(monitoring.DCGM_PORT))] = str(port)
    return args


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def _start(started: list[subprocess.Popen[str]], argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started.append(proc)
    return proc


def _wait_listening(port: int, deadline_s: float = 20) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def _scrape(port: int, deadline_s: float = 20) -> str:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_the_exporter_serves_provisions_fields_from_the_captured_gpu(root: Path, tmp_path: Path, started) -> None:
    engine_port, port = free_port(), free_port()
    _start(started, _argv(root, "nv-hostengine", _engine_args(engine_port)))
    counters = tmp_path / "provision-counters.csv"
    counters.write_text(dcgm_fields.counters_csv())
    exporter = ["-f", str(counters), "-a", f"127.0.0.1:{port}", "-r", f"127.0.0.1:{engine_port}"]
    _wait_listening(engine_port)  # the real exporter, too, needs its host engine at start
    _start(started, _argv(root, "dcgm-exporter", exporter))
    text = _scrape(port)
    samples = {line.split("{")[0]: line for line in text.splitlines() if line.startswith("DCGM_FI_")}
    # the idle H200 of the capture: 28 C, 77.71 W, Gen5 x16; no NVLink on a pass-through VM
    assert samples["DCGM_FI_DEV_GPU_TEMP"].endswith("} 28")
    assert samples["DCGM_FI_DEV_POWER_USAGE"].endswith("} 77.71")
    assert samples["DCGM_FI_DEV_PCIE_LINK_WIDTH"].endswith("} 16")
    assert 'UUID="GPU-00000000-0000-0000-0000-000000000000"' in samples["DCGM_FI_DEV_GPU_TEMP"]
    assert 'gpu="0"' in samples["DCGM_FI_DEV_GPU_TEMP"]
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" not in samples
    assert set(samples) <= {f.name for f in dcgm_fields.FIELDS}
    # The host engine gone: no field at all (provision_gpu_nvml_up then reads 0).
    started[0].kill()
    started[0].wait(timeout=10)
    assert "DCGM_FI_" not in _scrape(port)


def test_the_exporter_refuses_a_field_dcgm_does_not_have(root: Path, tmp_path: Path) -> None:
    counters = tmp_path / "bad.csv"
    counters.write_text("DCGM_FI_DEV_GPU_TEMPERATURE, gauge, misspelt.\n")
    done = subprocess.run(
        _argv(root, "dcgm-exporter", ["-f", str(counters), "-a", f"127.0.0.1:{free_port()}"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert "could not find DCGM field DCGM_FI_DEV_GPU_TEMPERATURE" in done.stderr


def test_the_host_engine_refuses_an_option_it_does_not_have_and_a_missing_account(root: Path) -> None:
    port = free_port()
    bad = subprocess.run(
        _argv(root, "nv-hostengine", [*_engine_args(port), "--listen-everywhere"]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0
    assert "unrecognized arguments: --listen-everywhere" in bad.stderr
    nobody = subprocess.run(
        _argv(root, "nv-hostengine", _engine_args(port, account="no-such-account-x")),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert nobody.returncode != 0
    assert "service account no-such-account-x does not exist" in nobody.stderr
