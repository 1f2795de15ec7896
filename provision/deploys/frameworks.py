"""Frameworks: a Python venv on every node with a pinned torch, numpy and nvidia-ml-py
(what the validator agent and the trainer import).

Packages come from an index (``pip_index_url``, or pip's own configuration) or from a
wheelhouse: a controller directory of .whl files uploaded to the node and installed with
``pip install --no-index --find-links`` (air-gapped clusters, and the testbed).
After the install, torch is imported with the venv's python; on GPU hosts
``torch.cuda.is_available()`` must be True as well.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, deploy, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_state
from pyinfra.operations import files, pip

from provision.engine import Step, current_node
from provision.facts.gpus import NvidiaDevices
from provision.settings import Settings

REMOTE_WHEELHOUSE = "/opt/provision/wheelhouse"


def requirements(settings: Settings, wheel_names: Sequence[str] = ()) -> list[str]:
    """pip requirement strings: torch pinned, numpy and nvidia-ml-py pinned when asked.

    A CPU or CUDA build from PyTorch's own index carries a local version label
    (2.13.0+cpu) and `pip freeze` reports it so; the pin takes the label from the
    wheelhouse's torch wheel, so a re-run sees the pin satisfied and installs nothing.
    """
    numpy = f"numpy=={settings.numpy_version}" if settings.numpy_version else "numpy"
    nvml = f"nvidia-ml-py=={settings.nvml_version}" if settings.nvml_version else "nvidia-ml-py"
    return [f"torch=={torch_version(settings.torch_version, wheel_names)}", numpy, nvml]


def torch_version(pinned: str, wheel_names: Sequence[str]) -> str:
    """The pinned torch version, with the local label of a matching wheelhouse wheel."""
    for name in wheel_names:
        parts = name.split("-")
        if parts[0] == "torch" and len(parts) > 1 and parts[1].split("+")[0] == pinned:
            return parts[1]
    return pinned


def pip_source_args(settings: Settings) -> str | None:
    """Where pip looks (the uploaded wheelhouse only, or the index URL), and whether it
    byte-compiles what it installs."""
    args = [] if settings.pip_compile else ["--no-compile"]
    if settings.wheelhouse:
        args.append(f"--no-index --find-links {REMOTE_WHEELHOUSE}")
    elif settings.pip_index_url:
        args.append(f"--index-url {shlex.quote(settings.pip_index_url)}")
    return " ".join(args) or None


def wheel_files(directory: str) -> list[Path]:
    """The .whl files of a controller wheelhouse, sorted, or ValueError when there are none."""
    found = sorted(Path(directory).expanduser().glob("*.whl"))
    if not found:
        raise ValueError(f"wheelhouse {directory} holds no .whl files")
    return found


def wheelhouse_gaps(settings: Settings, wheel_names: Sequence[str]) -> list[str]:
    """The requirements that no wheel of a wheelhouse satisfies (pip would stop on the
    host with "No matching distribution"; this finds it on the controller, before any
    host is changed). A wheel's name and version are the first two fields of its file
    name (PEP 427). Only the name and version are checked, not the Python tag."""
    wheels = [name.split("-")[:2] for name in wheel_names if name.count("-") >= 4]
    return [req for req in requirements(settings, wheel_names)
            if all(missing([req], {normalize(n): v}) for n, v in wheels)]


def check_script(need_cuda: bool) -> str:
    """Python that imports torch and prints one verdict line."""
    cuda = "assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'; " if need_cuda else ""
    return f"import torch, numpy, pynvml; {cuda}print('torch-ok', torch.__version__)"


def normalize(name: str) -> str:
    """PEP 503 name: nvidia_ml_py and nvidia-ml-py are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_freeze(lines: list[str]) -> dict[str, str]:
    """`pip freeze` lines into name -> version. Unlike pyinfra's PipPackages this keeps
    local version labels (torch==2.13.0+cpu), so a pinned CPU build is seen as installed."""
    out = {}
    for line in lines:
        name, sep, version = line.strip().partition("==")
        if sep:
            out[normalize(name)] = version
    return out


def missing(requirements: Sequence[str], installed: dict[str, str]) -> list[str]:
    """Requirements not satisfied: absent, or pinned to another version. As in PEP 440, a
    pin without a local label (2.13.0) is met by a local build of it (2.13.0+cpu)."""
    todo = []
    for req in requirements:
        name, _, version = req.partition("==")
        have = installed.get(normalize(name))
        if have is not None and "+" not in version:
            have = have.split("+")[0]
        if have is None or (version and have != version):
            todo.append(req)
    return todo


class VenvPackages(FactBase):
    """Installed packages of a venv, from its own pip."""

    default = dict

    def command(self, pip: str) -> str:
        return f"{pip} freeze --all 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_freeze(output)


@operation()
def venv_packages(pip: str, requirements: list[str], source_args: str | None):
    """pip install what the venv lacks (pinned versions compared exactly)."""
    todo = missing(requirements, host.get_fact(VenvPackages, pip=pip))
    if todo:
        yield " ".join([pip, "install", *([source_args] if source_args else []), *todo])


class TorchCheck(FactBase):
    """Import torch with the venv's python; the output says what failed."""

    def command(self, python: str, need_cuda: bool) -> str:
        return f"{python} -c {shlex.quote(check_script(need_cuda))} 2>&1 | tail -n 3 || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


def torch_problem(output: str, version: str) -> str | None:
    """None when the check printed torch-ok with the pinned version, else why not."""
    for line in output.splitlines():
        if line.startswith("torch-ok"):
            got = line.split()[1] if len(line.split()) > 1 else "?"
            # A local version label (2.13.0+cpu) still pins the same release.
            if got.split("+")[0] != version:
                return f"torch {got} is installed, {version} is pinned"
            return None
    return output.strip().splitlines()[-1] if output.strip() else "python printed nothing"


@operation()
def torch_works(python: str, version: str, need_cuda: bool):
    """Fail the host unless torch imports (and sees CUDA on GPU hosts). Checked when the
    run executes, after the install; changes nothing when torch works."""
    if ctx_state.get().current_stage != StateStage.Execute:
        return
    problem = torch_problem(host.get_fact(TorchCheck, python=python, need_cuda=need_cuda), version)
    if problem:
        yield f"echo {shlex.quote('torch check failed: ' + problem)} >&2; exit 1"


class WheelSizes(FactBase):
    """name -> size of the .whl files in a host directory, in one command."""

    default = dict

    def command(self, directory: str) -> str:
        return f"find {shlex.quote(directory)} -maxdepth 1 -name '*.whl' -printf '%f %s\\n' 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, int]:
        return {name: int(size) for name, _, size in (line.rpartition(" ") for line in output) if size.isdigit()}


@operation()
def wheel_file(src: str, dest: str):
    """Upload a wheel unless the host has a file of that name and size. A wheel's name
    carries its version and build (PEP 427), so name and size identify it: unlike
    files.put, no sha1 of a 190 MB torch wheel is computed on the host at every run
    (about 10 s on a small node), and one listing answers for every wheel. A torn upload
    has another size and is sent again."""
    directory, _, name = dest.rpartition("/")
    if host.get_fact(WheelSizes, directory=directory).get(name) == Path(src).stat().st_size:
        return
    yield FileUploadCommand(src, dest)
    yield f"chmod 644 {shlex.quote(dest)}"


def upload_wheelhouse(directory: str) -> None:
    files.directory(name="wheelhouse directory", path=REMOTE_WHEELHOUSE, mode="755")
    for wheel in wheel_files(directory):
        wheel_file(name=f"wheel {wheel.name}", src=str(wheel), dest=f"{REMOTE_WHEELHOUSE}/{wheel.name}")


@deploy("Frameworks")
def frameworks() -> None:
    settings = current_node().settings
    venv = settings.venv_path
    wheels = []
    if settings.wheelhouse:
        wheels = [w.name for w in wheel_files(settings.wheelhouse)]
        upload_wheelhouse(settings.wheelhouse)
    made = pip.virtualenv(name=f"venv {venv}", path=venv, venv=True, python="python3")
    installed = venv_packages(name="torch, numpy, nvidia-ml-py", pip=f"{venv}/bin/pip",
                              requirements=requirements(settings, wheels), source_args=pip_source_args(settings))
    need_cuda = bool(host.get_fact(NvidiaDevices).gpus)
    # On a GPU host the check runs every time: the driver under torch may have changed in
    # this same run. On a CPU host an unchanged venv was already checked when it was
    # made; importing torch again costs 10+ s on a small node and proves nothing new.
    torch_works(name="torch imports" + (" and sees CUDA" if need_cuda else ""),
                python=f"{venv}/bin/python", version=settings.torch_version, need_cuda=need_cuda,
                _if=lambda: need_cuda or made.did_change() or installed.did_change())


step = Step("frameworks", frameworks, "Python venv with pinned torch, numpy, nvidia-ml-py")
