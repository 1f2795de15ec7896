"""A task: the user's own job, read from a SkyPilot-style YAML file or from flags, checked
whole before anything is touched.

The keys follow SkyPilot's task spec where the two overlap, so an existing task's ``run``
block runs unchanged::

    name: my-finetune
    workdir: .                      # synced to the cluster; the job runs in its copy
    num_nodes: 2
    resources:
      accelerators: H100:8          # GPUs per node (the count is what provision uses)
    envs:
      LR: "3e-4"
    file_mounts:
      /shared/datasets/mine: ./data  # node path: local path
    setup: |
      echo once per node, before run
    run: |
      torchrun --nnodes $SKYPILOT_NUM_NODES --node-rank $SKYPILOT_NODE_RANK \\
        --nproc-per-node $SKYPILOT_NUM_GPUS_PER_NODE \\
        --master-addr $MASTER_ADDR --master-port $MASTER_PORT train.py

provision's own keys: ``pip`` (a list of requirements, beside or instead of the workdir's
requirements.txt), ``time_limit`` (seconds, or Slurm's [D-]HH:MM:SS) and ``include`` (paths
in the workdir synced although left out by default: .git, caches, files over 100 MiB).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.errors import InputError, Problem

TASK_MAX_BYTES = 1 << 20  # a task file past this is not a task
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_NODES = 4096
MAX_GPUS = 64
# Variables provision sets for every job: a task may not set them (the job would be told
# the wrong rank or directory).
RESERVED_ENVS = frozenset(
    {
        "SKYPILOT_NODE_RANK",
        "SKYPILOT_NODE_IPS",
        "SKYPILOT_NUM_NODES",
        "SKYPILOT_NUM_GPUS_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "PROVISION_RUN_ID",
        "PROVISION_RUN_DIR",
        "PROVISION_NODE",
        "PROVISION_METRICS",
        "VIRTUAL_ENV",
        "HOME",
        "USER",
        "LOGNAME",
    }
)
# Variables a task may not set because they change what the job's shell or its python load
# before the task's own code (the job runs as the training user, so this is the user's
# own business, but an inherited LD_PRELOAD in a task copied from elsewhere is a surprise).
LOADER_ENVS = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "PYTHONSTARTUP"})
# SkyPilot keys a cluster provision built cannot honour, and why.
CLOUD_KEYS = {
    "service": "SkyServe services are not run by provision; run the server as a task's run",
    "storage_mounts": "cloud buckets are not mounted by provision; copy the data onto a share (file_mounts)",
    "volumes": "SkyPilot volumes are cloud disks; use the cluster's shares (nfs_exports)",
    "config": "SkyPilot's config overrides have no meaning here",
    "event_callback": "not supported by provision",
    "secrets": "pass secrets as files on the share, never in a task file",
}
CLOUD_RESOURCES = {
    "cloud",
    "region",
    "zone",
    "instance_type",
    "use_spot",
    "spot_recovery",
    "job_recovery",
    "image_id",
    "disk_size",
    "disk_tier",
    "ports",
    "labels",
    "network_tier",
    "any_of",
    "ordered",
    "autostop",
    "infra",
}
KNOWN_RESOURCES = {"accelerators", "cpus", "memory"}
KNOWN = {
    "name", "workdir", "num_nodes", "resources", "envs", "file_mounts", "setup", "run", "pip", "time_limit", "include",
}  # fmt: skip


@dataclass(frozen=True)
class Task:
    """What to run, checked."""

    run: str  # shell script run on every node, as the job's user, in the synced workdir
    name: str = "job"  # shown in `runs`; the run id is unique, the name need not be
    workdir: Path | None = None  # controller directory synced to the nodes; None: nothing synced
    num_nodes: int = 1  # nodes the job runs on together
    gpus_per_node: int = 0  # from resources.accelerators ("H100:8" -> 8); 0: none asked for
    accelerator: str | None = None  # the GPU name asked for ("H100"), reported, not enforced
    envs: tuple[tuple[str, str], ...] = ()  # more environment, in the file's order
    file_mounts: tuple[tuple[str, Path], ...] = ()  # (node path, controller path)
    setup: str | None = None  # once per node before run; its output is shown
    pip: tuple[str, ...] = ()  # requirements beside the workdir's requirements.txt
    time_limit_s: int | None = None  # Slurm's --time and the SSH run's deadline; None: no limit
    source: str = "flags"  # the task file's path, or "flags", for messages
    include: tuple[str, ...] = field(default=())  # workdir names synced although excluded by default


def load(path: Path, overrides: dict[str, Any] | None = None) -> Task:
    """The task file at ``path``, with ``overrides`` (the command line's keys) over its
    own; every problem in one InputError (exit 2)."""
    data = read_mapping(path)
    extra = dict(overrides or {})
    if isinstance(data.get("envs"), dict) and "envs" in extra:  # --env adds to the file's envs
        extra["envs"] = {**data["envs"], **extra["envs"]}
    return from_mapping({**data, **extra}, str(path), base=path.resolve().parent)


def read_mapping(path: Path) -> dict[str, Any]:
    """The task file's keys, read as a bounded regular file and parsed as YAML."""
    where = str(path)
    try:
        if not path.is_file():
            raise InputError(Problem(where, "not a task file (no such regular file)"))
        if path.stat().st_size > TASK_MAX_BYTES:
            raise InputError(Problem(where, f"over {TASK_MAX_BYTES} bytes: not a task file"))
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(Problem(where, f"cannot be read ({e})")) from None
    return _parse_yaml(where, text)


def _parse_yaml(where: str, text: str) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(Problem(where, f"is not YAML{at}: {getattr(e, 'problem', None) or e}")) from None
    if not isinstance(data, dict):
        raise InputError(Problem(where, "must be a mapping of task keys (name, workdir, num_nodes, run, ...)"))
    return data


def from_mapping(data: dict[str, Any], where: str, base: Path) -> Task:
    """A task from its keys (a parsed file, or the flags put in the same shape). Relative
    paths are taken from ``base`` (the task file's directory, as SkyPilot does)."""
    problems: list[Problem] = []

    def bad(key: str, what: str, fix: str = "") -> None:
        problems.append(Problem(f"{where}: {key}", what, fix))

    _keys(data, bad)
    run = data.get("run")
    if not isinstance(run, str) or not run.strip():
        bad("run", "missing or empty: the commands the job runs on every node")
    name = data.get("name", "job")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        bad("name", f"{name!r} is not a name (letters, digits, . _ -; up to 63)")
    nodes = data.get("num_nodes", 1)
    if type(nodes) is not int or not 1 <= nodes <= MAX_NODES:
        bad("num_nodes", f"{nodes!r} is not a whole number of nodes from 1 to {MAX_NODES}")
    gpus, accel = _resources(data.get("resources"), bad)
    envs = _envs(data.get("envs"), bad)
    workdir = _path(data.get("workdir"), base, "workdir", bad, directory=True)
    mounts = _mounts(data.get("file_mounts"), base, bad)
    setup = data.get("setup")
    if setup is not None and not isinstance(setup, str):
        bad("setup", "must be shell text")
    pip = _pip(data.get("pip", []), bad)
    limit = _time_limit(data.get("time_limit"), bad)
    include = _include(data.get("include", []), bad)
    if problems:
        raise InputError(problems)
    return Task(
        run=str(run),
        name=name,
        workdir=workdir,
        num_nodes=nodes,
        gpus_per_node=gpus,
        accelerator=accel,
        envs=envs,
        file_mounts=mounts,
        setup=setup,
        pip=tuple(p.strip() for p in pip),
        time_limit_s=limit,
        source=where,
        include=include,
    )


def _keys(data: dict[str, Any], bad: Any) -> None:
    for key in data:
        if not isinstance(key, str):
            bad(repr(key), "keys are names")
        elif key in CLOUD_KEYS:
            bad(key, f"not supported: {CLOUD_KEYS[key]}")
        elif key not in KNOWN:
            bad(key, "unknown key", f"task keys: {', '.join(sorted(KNOWN))}")


def _pip(value: Any, bad: Any) -> list[str]:
    pip = [value] if isinstance(value, str) else value
    if not isinstance(pip, list) or not all(isinstance(p, str) and p.strip() and "\n" not in p for p in pip):
        bad("pip", "must be a list of requirement lines, e.g. [tqdm==4.66.5]")
        return []
    return pip


def _include(value: Any, bad: Any) -> tuple[str, ...]:
    ok = isinstance(value, list) and all(isinstance(p, str) and p and not p.startswith("/") for p in value)
    if not ok or any(".." in p.split("/") for p in value):
        bad("include", "must be a list of paths inside the workdir, e.g. [.git]")
        return ()
    return tuple(os.path.normpath(p) for p in value)


def _resources(value: Any, bad: Any) -> tuple[int, str | None]:
    if value is None:
        return 0, None
    if not isinstance(value, dict):
        bad("resources", "must be a mapping (accelerators: H100:8)")
        return 0, None
    for key in value:
        if key in CLOUD_RESOURCES:
            bad(f"resources.{key}", "not supported: a provision cluster is the machines it was given, not a cloud")
        elif key not in KNOWN_RESOURCES:
            bad(f"resources.{key}", "unknown key", "resources keys: accelerators, cpus, memory")
    accel = value.get("accelerators")
    return (0, None) if accel is None else _accelerators(accel, bad)


def _accelerators(accel: Any, bad: Any) -> tuple[int, str | None]:
    """SkyPilot's forms: "H100:8", "H100" (one), {H100: 8}."""
    if isinstance(accel, dict) and len(accel) == 1:  # {H100: 8}
        ((kind, count),) = accel.items()
    elif isinstance(accel, str):
        kind, _, count = accel.partition(":")
        count = count or "1"
    else:
        bad("resources.accelerators", f"{accel!r} is not NAME:COUNT (e.g. H100:8)")
        return 0, None
    try:
        n = int(count)
    except (TypeError, ValueError):
        n = -1
    if not isinstance(kind, str) or not NAME.fullmatch(kind) or not 1 <= n <= MAX_GPUS:
        bad("resources.accelerators", f"{accel!r} is not NAME:COUNT with 1 to {MAX_GPUS} GPUs (e.g. H100:8)")
        return 0, None
    return n, kind


def _envs(value: Any, bad: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        bad("envs", "must be a mapping of NAME: value")
        return ()
    out = []
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_KEY.fullmatch(key):
            bad(f"envs.{key}", "is not an environment variable name")
        elif key in RESERVED_ENVS:
            bad(f"envs.{key}", "is set by provision for every job (its rank, nodes or directories)")
        elif key in LOADER_ENVS:
            bad(f"envs.{key}", "changes what every program of the job loads; set it in run if you mean it")
        elif val is None:
            bad(f"envs.{key}", "has no value (SkyPilot asks for it with --env; give it here or with --env)")
        elif isinstance(val, bool) or not isinstance(val, (str, int, float)):
            bad(f"envs.{key}", f"{val!r} is not a string or a number")
        elif "\0" in str(val):
            bad(f"envs.{key}", "holds a NUL")
        else:
            out.append((key, str(val)))
    return tuple(out)


def _path(value: Any, base: Path, key: str, bad: Any, directory: bool) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        bad(key, f"{value!r} is not a path")
        return None
    if "://" in value:
        bad(key, f"{value} is a cloud or remote URL: provision syncs local directories only")
        return None
    path = (base / os.path.expanduser(value)).resolve()
    if directory and not path.is_dir():
        bad(key, f"{path} is not a directory")
        return None
    if not directory and not path.exists():
        bad(key, f"{path} does not exist")
        return None
    return path


def _mounts(value: Any, base: Path, bad: Any) -> tuple[tuple[str, Path], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        bad("file_mounts", "must be a mapping of node path: local path")
        return ()
    out = []
    for target, source in value.items():
        key = f"file_mounts.{target}"
        if not isinstance(target, str) or not (target.startswith("/") or target.startswith("~/")):
            bad(key, "the node path must be absolute or start with ~/")
            continue
        if "\0" in target or "\n" in target or any(p == ".." for p in target.split("/")):
            bad(key, "the node path may not hold '..', a newline or a NUL")
            continue
        if isinstance(source, dict):
            bad(key, "cloud storage mounts are not supported; give a local path")
            continue
        local = _path(source, base, key, bad, directory=False)
        if local is not None:
            out.append((target, local))
    return tuple(out)


_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d{1,2}):(\d{2}):(\d{2})")


def _time_limit(value: Any, bad: Any) -> int | None:
    if value is None:
        return None
    if type(value) is int and 1 <= value <= 365 * 86400:
        return value
    m = _SLURM_TIME.fullmatch(value) if isinstance(value, str) else None
    if m:
        days, h, mi, s = (int(x or 0) for x in m.groups())
        total = days * 86400 + h * 3600 + mi * 60 + s
        if 1 <= total <= 365 * 86400:
            return total
    bad("time_limit", f"{value!r} is not seconds (1 to a year) or [D-]HH:MM:SS")
    return None
