"""Facts about a node's Python venv: its packages (pip freeze), whether torch imports, the
wheels already uploaded."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase


class VenvPackages(FactBase[dict[str, str]]):
    """Installed packages of a venv, from its own pip."""

    default = dict

    def command(self, pip: str) -> str:
        return f"{shlex.quote(pip)} freeze --all 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_freeze(output)


class TorchCheck(FactBase[str]):
    """Import torch with the venv's python; the output says what failed."""

    def command(self, python: str, need_cuda: bool) -> str:
        return f"{shlex.quote(python)} -c {shlex.quote(check_script(need_cuda))} 2>&1 | tail -n 3 || true"

    def process(self, output: list[str]) -> str:
        return "\n".join(output)


class WheelSizes(FactBase[dict[str, int]]):
    """name -> size of the .whl files in a host directory, in one command."""

    default = dict

    def command(self, directory: str) -> str:
        return f"find {shlex.quote(directory)} -maxdepth 1 -name '*.whl' -printf '%f %s\\n' 2>/dev/null || true"

    def process(self, output: list[str]) -> dict[str, int]:
        return {name: int(size) for name, _, size in (line.rpartition(" ") for line in output) if size.isdigit()}


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
