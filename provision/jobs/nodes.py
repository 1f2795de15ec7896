"""The nodes of a job, as the controller finds them: each one checked (python, interface,
GPUs, the training user, its root-owned run directory made and the reaper put there), and
whether another provision run is busy on it; over SSH, the first N free ones are taken."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.jobs.layout import NodeJob
from provision.launch import plan as launch_plan
from provision.launch.session import REAPER

PROBE_TIMEOUT_S = 120
# A run of provision in progress on the node: a live pid recorded in a run directory whose
# process is one of provision's launchers (its $0 names it).
BUSY = (
    'for f in "$T"/runs/*/*/torchrun.pid; do [ -f "$f" ] || continue; p=$(head -c 20 "$f" | tr -dc 0-9); '
    '[ -n "$p" ] && tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -q "provision-\\(job\\|train\\)" '
    '&& echo "BUSY $(basename "$(dirname "$(dirname "$f")")")"; done; true'
)


@dataclass(frozen=True)
class Probed:
    """What the check found on one node."""

    node: NodeJob | None  # None when the node cannot run the job
    busy: str | None  # the run id of provision's run in progress there
    problem: str | None  # why it cannot run the job


def probe(node: Node, conn: Any, run_id: str, base_python: str) -> Probed:
    """One round trip: the node's facts, its run directory made, the reaper uploaded. The
    venv's python is looked for, not started (a start costs a second on a busy node; one
    that is there but broken fails in the job's own log, with its reason)."""
    s = node.settings
    run_dir = launch_plan.run_dir(s.train_dir, run_id, node.name)
    command = (
        f"T={shlex.quote(s.train_dir)}; test -x {shlex.quote(base_python)} && echo PY_OK; ip -j addr; "
        "echo '--gpus--'; nvidia-smi -L 2>/dev/null; echo '--busy--'; "
        f"{BUSY}; echo '--run-as--'; RUN_AS=$({launch_plan.run_as_probe(s.training_user)}); export RUN_AS; "
        f"echo \"$RUN_AS\"; echo '--dirs--'; {launch_plan.node_dirs_command(s.train_dir, run_dir, s.training_user)}"
    )
    r = remote.run(node, command, timeout=min(s.command_timeout_s, PROBE_TIMEOUT_S), conn=conn)
    if r.exited == -1:
        return Probed(None, None, f"unreachable ({r.stderr.strip()[-200:]})")
    if r.exited == remote.TIMED_OUT:
        return Probed(None, None, f"its check timed out after {PROBE_TIMEOUT_S} s")
    head, _, rest = r.stdout.partition("--gpus--")
    gpus, _, rest = rest.partition("--busy--")
    busy_out, _, rest = rest.partition("--run-as--")
    run_as_out, _, dirs = rest.partition("--dirs--")
    busy = next((line.split()[1] for line in busy_out.splitlines() if line.startswith("BUSY ")), None)
    if "PY_OK" not in head:
        return Probed(None, busy, f"{base_python} cannot be run: run `provision up` (frameworks)")
    interface = s.cluster_interface or launch_plan.interface_for(node.cluster_address, head.split("PY_OK", 1)[1])
    if not interface:
        return Probed(None, busy, f"no interface holds cluster address {node.cluster_address}")
    if "DIRS_OK" not in dirs:
        return Probed(None, busy, f"train_dir {s.train_dir} cannot be used: {dirs.strip()[-300:]}")
    conn.put(str(REAPER), f"{run_dir}/reaper.py")
    run_as = s.training_user if f"RUN_AS={s.training_user}" in run_as_out else None
    job = NodeJob(node.name, 0, node.cluster_address, interface, launch_plan.gpu_count(gpus), run_dir, run_as)
    return Probed(job, busy, None)


def pick(probed: dict[str, Probed], order: list[str], count: int, gpus: int = 0) -> tuple[list[NodeJob], list[str]]:
    """The first ``count`` nodes that can run the job, are free and have the ``gpus`` it
    asks for, ranked in inventory order; and why each other node was passed over. A
    chosen node's part uses the GPUs asked for (SKYPILOT_NUM_GPUS_PER_NODE, as SkyPilot)."""
    chosen: list[NodeJob] = []
    passed: list[str] = []
    for name in order:
        p = probed[name]
        if p.node is None:
            passed.append(f"{name}: {p.problem}")
        elif p.busy:
            passed.append(f"{name}: busy with {p.busy}")
        elif p.node.gpus < gpus:
            passed.append(f"{name}: has {p.node.gpus} GPU(s), the task asks for {gpus} a node")
        elif len(chosen) < count:
            chosen.append(replace(p.node, rank=len(chosen), gpus=gpus))
    return chosen, passed
