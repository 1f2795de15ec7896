"""Custom pyinfra operations of the frameworks step: install what the venv lacks, check torch
imports, upload a wheel unless the host has it."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_state

from provision.facts.venv import TorchCheck, VenvPackages
from provision.rules.frameworks import missing, torch_problem


@operation()
def venv_packages(
    pip: str, requirements: list[str], source_args: str | None, hashed: bool = False
) -> Generator[Any, None, None]:
    """pip install what the venv lacks (pinned versions compared exactly). ``hashed``: the
    source arguments name a --require-hashes requirements file, which pip installs whole
    (requirements on the command line cannot carry hashes)."""
    todo = missing(requirements, host.get_fact(VenvPackages, pip=pip))
    if todo:
        yield install_command(pip, [] if hashed else todo, source_args)


def install_command(pip: str, requirements: list[str], source_args: str | None) -> str:
    """pip install of the requirements; ``source_args`` is already quoted by its builder
    (rules.frameworks.pip_source_args), every other value is quoted here."""
    source = [source_args] if source_args else []
    return " ".join([shlex.quote(pip), "install", *source, *(shlex.quote(r) for r in requirements)])


@operation()
def torch_works(python: str, version: str, need_cuda: bool) -> Generator[Any, None, None]:
    """Fail the host unless torch imports (and sees CUDA on GPU hosts). Checked when the
    run executes, after the install; changes nothing when torch works."""
    if ctx_state.get().current_stage != StateStage.Execute:
        return
    problem = torch_problem(host.get_fact(TorchCheck, python=python, need_cuda=need_cuda), version)
    if problem:
        yield f"echo {shlex.quote('torch check failed: ' + problem)} >&2; exit 1"


@operation()
def wheel_file(src: str, dest: str, size_here: int, size_there: int | None) -> Generator[Any, None, None]:
    """Upload a wheel unless the host has a file of that name and size (``size_there``,
    from one WheelSizes listing the deploy asks for all its wheels: pyinfra does not keep
    facts, and a listing a wheel made a converged up list the wheelhouse 24 times a host).
    A wheel's name carries its version and build (PEP 427), so name and size identify it:
    unlike files.put, no sha1 of a 190 MB torch wheel is computed on the host at every run
    (about 10 s on a small node). A torn upload has another size and is sent again.
    ``size_here`` is the wheel's size on the controller, taken once per pass."""
    if size_there == size_here:
        return
    yield FileUploadCommand(src, dest)
    yield f"chmod 644 {shlex.quote(dest)}"
