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
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, pip

from provision.engine import Step, current_node, note, refuse
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


def upload_wheelhouse(directory: str) -> bool:
    """Upload the wheels and their hash-pinned requirements; False (the host refused) when
    a wheel does not match the wheelhouse's SHA256SUMS."""
    problem = sums_problem(directory)
    if problem:
        refuse("frameworks", problem)
        return False
    files.directory(name="wheelhouse directory", path=REMOTE_WHEELHOUSE, mode="755")
    there = host.get_fact(WheelSizes, directory=REMOTE_WHEELHOUSE)  # one listing for every wheel
    for wheel in wheel_files(directory):
        wheel_file(
            name=f"wheel {wheel.name}",
            src=str(wheel),
            dest=f"{REMOTE_WHEELHOUSE}/{wheel.name}",
            size_there=there.get(wheel.name),
        )
    files.put(
        name="requirements.txt: the wheels' hashes",
        src=StringIO(hashed_requirements(directory)),
        dest=REMOTE_REQUIREMENTS,
        mode="644",
    )
    return True


@deploy("Frameworks")
def frameworks() -> None:
    settings = current_node().settings
    venv = settings.venv_path
    wheels = []
    if settings.wheelhouse:
        wheels = [w.name for w in wheel_files(settings.wheelhouse)]
        if not upload_wheelhouse(settings.wheelhouse):
            return
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
