"""Stop one training run on this node, by process group and pid, never by name.

Runs ON THE NODE (uploaded beside the trainer; standard library only):

    python reaper.py RUN_DIR RUN_ID NODE [--grace S] [--check]

Targets, found from /proc before any signal is sent (a killed parent's children are
re-parented and their ancestry is lost):
  - torchrun's pid from RUN_DIR/torchrun.pid, which is also its process group and session
    (it was started under setsid), and every process in that group. The file is believed
    only when this user owns it and no one else can write it, and the pid only when it is
    above 1 and the process is ours: the run's markers in its environment, or the run id
    among its arguments. Root runs this reaper, so a pid another user could write would
    let that user have any process killed (``1`` in the file: every process);
  - every descendant of it, and their process groups (torchrun starts each worker in a
    session of its own);
  - any process whose environment carries PROVISION_RUN_ID=RUN_ID and PROVISION_NODE=NODE
    (a worker whose torchrun is already gone).
SIGTERM to all of them, SIGKILL to what is left after the grace period. Prints a JSON
line {"pgid", "signalled", "left"}; exit 0 when nothing of the run is left.
``--check`` only reports what would be targeted.

``--workers-of-world W`` (an elastic run that lost a node): SIGKILL only the run's
workers, torchrun's descendants outside its own process group, that were started for a
world of W ranks (WORLD_SIZE in their environment, which torchrun sets), and leave
torchrun alone: it sees its workers fail and restarts them at the next rendezvous, without
the lost node. Workers it already restarted on its own without that node have another
world size and are spared. Prints {"workers": [pids signalled]}.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) for every process visible in /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z":  # a zombie is already dead; its parent reaps it
            out[int(entry)] = (int(fields[1]), int(fields[2]))
    return out


def marked(pid: int, run_id: str, node: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = set(f.read().split(b"\0"))
    except OSError:
        return False
    return f"PROVISION_RUN_ID={run_id}".encode() in env and f"PROVISION_NODE={node}".encode() in env


def ours(pid: int, run_id: str, node: str) -> bool:
    """The process belongs to this run: its environment carries the run's markers (set
    before setsid, so torchrun's whole chain has them), or the run id is one of its
    arguments (torchrun's --rdzv-id)."""
    if pid <= 1:
        return False
    if marked(pid, run_id, node):
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return run_id.encode() in args


def parse_pid(text: str) -> int | None:
    """A pid above 1 written as plain decimal digits; anything else (0, 1, -5, 12abc,
    an empty file) is None: kill(0) and kill(-1) reach far more than one run."""
    text = text.strip()
    if not re.fullmatch(r"[0-9]{1,10}", text):
        return None
    pid = int(text)
    return pid if pid > 1 else None


def read_pid(path: str) -> int | None:
    """torchrun's pid from the run file, or None when the file cannot be trusted: a link,
    owned by another user, or writable by group or others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        return parse_pid(f.read(64))


def targets(root: int | None, run_id: str, node: str) -> set[int]:
    procs = processes()
    found = {p for p in procs if p > 1 and marked(p, run_id, node)}
    if root is not None and not (root in procs and ours(root, run_id, node)):
        root = None  # gone, or not ours: neither it nor a group of that id is touched
    if root is not None:
        found.add(root)
    groups = {root} if root is not None else set()
    changed = True
    while changed:  # close over children and process groups
        changed = False
        for pid, (ppid, pgid) in procs.items():
            if pid not in found and (ppid in found or pgid in groups):
                found.add(pid)
                changed = True
        new_groups = {procs[p][1] for p in found if p in procs and procs[p][1] > 1} - groups
        if new_groups:
            groups |= new_groups
            changed = True
    mine = {os.getpid(), os.getppid()}
    return {p for p in found if p not in mine and p > 1}


def signal_all(pids: set[int], sig: int) -> None:
    own_group = os.getpgrp()
    for pid in pids:
        if pid <= 1:  # never kill(0)/kill(-1) or init, whatever reached this set
            continue
        _quiet(os.kill, pid, sig)
        if pid != own_group:
            _quiet(os.killpg, pid, sig)  # the group this pid leads, if it leads one


def _quiet(kill: Callable[[int, int], None], pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone already, or not ours
        kill(pid, sig)


def alive(pids: set[int]) -> set[int]:
    live = processes()
    return {p for p in pids if p in live}


def world_of(pid: int) -> int | None:
    """WORLD_SIZE in a process's environment (torchrun sets it for its workers)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"WORLD_SIZE="):
            value = item[len(b"WORLD_SIZE=") :]
            return int(value) if value.isdigit() and len(value) < 10 else None
    return None


def workers(root: int | None, run_id: str, node: str, world: int) -> set[int]:
    """torchrun's workers of a world of ``world`` ranks: the descendants of its process
    (``root``, which leads its own group) outside that group (each worker has a session of
    its own), and their children. Never what is above torchrun: the ``setsid --wait`` that
    holds the SSH command open carries the run's markers too."""
    procs = processes()
    if root is None or root not in procs or not ours(root, run_id, node):
        return set()
    below, changed = {root}, True
    while changed:
        changed = False
        for pid, (ppid, _) in procs.items():
            if pid not in below and ppid in below:
                below.add(pid)
                changed = True
    return {pid for pid in below - {root, os.getpid()} if procs[pid][1] != root and world_of(pid) == world}


def main(argv: list[str]) -> int:
    run_dir, run_id, node = argv[:3]
    grace = float(argv[argv.index("--grace") + 1]) if "--grace" in argv else 5.0
    root = read_pid(os.path.join(run_dir, "torchrun.pid"))
    if "--workers-of-world" in argv:
        chosen = workers(root, run_id, node, int(argv[argv.index("--workers-of-world") + 1]))
        signal_all(chosen, signal.SIGKILL)
        print(json.dumps({"workers": sorted(chosen)}))
        return 0
    found = targets(root, run_id, node)
    if "--check" in argv:
        print(json.dumps({"pgid": root, "signalled": [], "left": sorted(found)}))
        return 1 if found else 0
    signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(found) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(found):
        signal_all(alive(found), signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(found) and time.monotonic() < deadline:
            time.sleep(0.1)
    left = alive(found) | targets(root, run_id, node)
    print(json.dumps({"pgid": root, "signalled": sorted(found), "left": sorted(left)}))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
