"""Frameworks: a Python venv on every node with a pinned torch, numpy and nvidia-ml-py
(what the validator agent and the trainer import).

Packages come from an index (``pip_index_url``, or pip's own configuration) or from a
wheelhouse: a controller directory of .whl files uploaded to the node and installed with
``pip install --no-index --find-links`` (air-gapped clusters, and the testbed), each wheel
checked against the wheelhouse's SHA256SUMS on the controller and by pip
(``--require-hashes``) on the node. From an index, pip checks every file against the hashes
of ``pip_lock_file`` (uploaded); without one the step is refused before any host is
contacted, unless ``pip_require_hashes = false``. pip takes wheels only (``--only-binary=:all:``).
After the install, torch is imported with the venv's python; on GPU hosts
``torch.cuda.is_available()`` must be True as well.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, pip

from provision.engine import Step, current_node, note, once_per_pass, refuse
from provision.facts.gpus import NvidiaDevices
from provision.facts.venv import WheelSizes
from provision.operations.venv import torch_works, venv_packages, wheel_file
from provision.rules.frameworks import (
    REMOTE_LOCK,
    REMOTE_REQUIREMENTS,
    REMOTE_WHEELHOUSE,
    hashed,
    hashed_requirements,
    lock_candidates,
    pip_source_args,
    requirements,
    sums_problem,
    wheel_files,
)


@dataclass(frozen=True)
class Wheelhouse:
    """A controller wheelhouse as checked for this pass: the same for every host."""

    problem: str | None  # why its wheels cannot be trusted (sums_problem), or None
    wheels: tuple[tuple[Path, int], ...] = ()  # each wheel and its size here
    requirements: str = ""  # pip's --require-hashes lines for them


def checked_wheelhouse(directory: str) -> Wheelhouse:
    """The wheelhouse checked against its SHA256SUMS, listed and sized: once per pass, as
    every host of a pass is sent the same wheels (per host, the listing, the check and a
    stat of each wheel were the controller's CPU a thousand times over: issue 20)."""
    problem = sums_problem(directory)
    if problem:
        return Wheelhouse(problem)
    wheels = tuple((w, w.stat().st_size) for w in wheel_files(directory))
    return Wheelhouse(None, wheels, hashed_requirements(directory))


def upload_wheelhouse(directory: str) -> list[str] | None:
    """Upload the wheels and their hash-pinned requirements: the wheels' names, or None (the
    host refused) when a wheel does not match the wheelhouse's SHA256SUMS."""
    wheelhouse = once_per_pass(f"wheelhouse {directory}", lambda: checked_wheelhouse(directory))
    if wheelhouse.problem:
        refuse("frameworks", wheelhouse.problem)
        return None
    files.directory(name="wheelhouse directory", path=REMOTE_WHEELHOUSE, mode="755")
    there = host.get_fact(WheelSizes, directory=REMOTE_WHEELHOUSE)  # one listing for every wheel
    for wheel, size in wheelhouse.wheels:
        wheel_file(
            name=f"wheel {wheel.name}",
            src=str(wheel),
            dest=f"{REMOTE_WHEELHOUSE}/{wheel.name}",
            size_here=size,
            size_there=there.get(wheel.name),
        )
    files.put(
        name="requirements.txt: the wheels' hashes",
        src=StringIO(wheelhouse.requirements),
        dest=REMOTE_REQUIREMENTS,
        mode="644",
    )
    return [wheel.name for wheel, _ in wheelhouse.wheels]


@deploy("Frameworks")
def frameworks() -> None:
    settings = current_node().settings
    venv = settings.venv_path
    wheels = []
    if settings.wheelhouse:
        uploaded = upload_wheelhouse(settings.wheelhouse)
        if uploaded is None:
            return
        wheels = uploaded
    elif settings.pip_lock_file:
        # Checked on the controller (pipeline.check_inputs): pinned, hashed lines only.
        wheels = lock_candidates(settings.pip_lock_file)
        lock_dir = posixpath.dirname(REMOTE_LOCK)
        files.directory(name=lock_dir, path=lock_dir, mode="755")
        files.put(name="pip lock: every file's hash", src=settings.pip_lock_file, dest=REMOTE_LOCK, mode="644")
    else:
        note("frameworks: pip takes the index's files unchecked (pip_require_hashes = false, no pip_lock_file)")
    made = pip.virtualenv(name=f"venv {venv}", path=venv, venv=True, python="python3")
    installed = venv_packages(
        name="torch, numpy, nvidia-ml-py",
        pip=f"{venv}/bin/pip",
        requirements=requirements(settings, wheels),
        source_args=pip_source_args(settings),
        hashed=hashed(settings),
    )
    need_cuda = bool(host.get_fact(NvidiaDevices).gpus)
    # On a GPU host the check runs every time: the driver under torch may have changed in
    # this same run. On a CPU host an unchanged venv was already checked when it was
    # made; importing torch again costs 10+ s on a small node and proves nothing new.
    torch_works(
        name="torch imports" + (" and sees CUDA" if need_cuda else ""),
        python=f"{venv}/bin/python",
        version=settings.torch_version,
        need_cuda=need_cuda,
        _if=lambda: need_cuda or made.did_change() or installed.did_change(),
    )


step = Step("frameworks", frameworks, "Python venv with pinned torch, numpy, nvidia-ml-py")
