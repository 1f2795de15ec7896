"""`provision runs`, `logs` and `cancel`: a job's state read from the cluster itself (its
directory on the share or on each node, Slurm's queue, the root-owned pid files), so it
survives the controller being closed after ``--detach``."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from provision import remote
from provision.inventory import Cluster, Node
from provision.jobs import layout, results, slurm
from provision.launch import plan as launch_plan

RUN_ID = re.compile(r"job-\d{8}-\d{6}-[0-9a-f]{6}")
LIST_TIMEOUT_S = 60
RECORD_MAX = 4096


@dataclass
class RunRow:
    """One job as `runs` lists it."""

    id: str
    name: str = "?"
    user: str = "?"
    nodes: list[str] = field(default_factory=list)
    scheduler: str = "?"
    started: float | None = None
    ended: float | None = None  # the last exit status written (unix time); None while none is
    state: str = "unknown"  # running, succeeded, failed, queued (Slurm), stopped (no process, no exit)
    exits: dict[str, int] = field(default_factory=dict)


def where_of(cluster: Cluster) -> layout.Where:
    """Where the cluster keeps its jobs (a share, else each node)."""
    return layout.where(cluster.nodes[0].settings, cluster.storage_node() is not None)


def _readers(cluster: Cluster, where: layout.Where) -> list[Node]:
    """The nodes to read job directories from: one, when they are on a share."""
    return list(cluster.nodes[:1]) if where.shared else list(cluster.nodes)


def list_command(where: layout.Where, user: str | None, train_dir: str) -> str:
    """Every job directory's record and exits (as the job's user), then the runs whose
    launcher lives on this node (pid files are root's)."""
    jobs = shlex.quote(where.jobs)
    per_job = (
        f'for d in {jobs}/job-*; do [ -d "$d" ] || continue; echo "== ${{d##*/}}"; '
        f'head -c {RECORD_MAX} "$d/job.json" 2>/dev/null; echo; '
        'for f in "$d"/exit/*; do [ -f "$f" ] && echo "exit ${f##*/} $(head -c 16 "$f" | tr -dc 0-9-)"; done; '
        'echo "ended $(stat -c %Y "$d"/exit/* 2>/dev/null | sort -n | tail -n 1)"; '
        "done; true"
    )
    live = (
        f'T={shlex.quote(train_dir)}; for f in "$T"/runs/job-*/*/torchrun.pid; do [ -f "$f" ] || continue; '
        'p=$(head -c 20 "$f" | tr -dc 0-9); [ -n "$p" ] && tr "\\0" " " < /proc/$p/cmdline 2>/dev/null '
        '| grep -q provision-job && echo "live $(basename "$(dirname "$(dirname "$f")")")"; done; true'
    )
    return f"{as_training_user(user, per_job) if user else per_job}; {live}"


def parse_list(text: str) -> tuple[dict[str, RunRow], set[str]]:
    """(rows by id, ids with a live launcher). Records are data: only known keys of the
    right types are taken."""
    rows: dict[str, RunRow] = {}
    live: set[str] = set()
    current: RunRow | None = None
    for line in text.splitlines():
        if line.startswith("== ") and RUN_ID.fullmatch(line[3:]):
            current = rows.setdefault(line[3:], RunRow(line[3:]))
        elif line.startswith("live ") and RUN_ID.fullmatch(line[5:]):
            live.add(line[5:])
        elif line.startswith("exit ") and current is not None:
            _, name, code = [*line.split(), "", ""][:3]
            if code.lstrip("-").isdigit():
                current.exits[name] = int(code)
        elif line.startswith("ended ") and current is not None and line[6:].strip().isdigit():
            current.ended = float(line[6:].strip())
        elif line.startswith("{") and current is not None:
            _take_record(current, line)
    return rows, live


def _take_record(row: RunRow, line: str) -> None:
    try:
        data: Any = json.loads(line)
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    for key in ("name", "user", "scheduler"):
        if isinstance(data.get(key), str):
            setattr(row, key, data[key][:64])
    if isinstance(data.get("started"), (int, float)):
        row.started = float(data["started"])
    nodes = data.get("nodes")
    if isinstance(nodes, list):
        row.nodes = [str(n)[:64] for n in nodes][:4096]


def state_of(row: RunRow, live: bool, slurm_state: str | None) -> str:
    if slurm_state:
        return {"PENDING": "queued", "RUNNING": "running", "COMPLETING": "running"}.get(
            slurm_state, slurm_state.lower()
        )
    if live:
        return "running"
    if row.exits and (row.scheduler == "slurm" or set(row.nodes) <= set(row.exits)):
        return "succeeded" if all(v == 0 for v in row.exits.values()) else "failed"
    return "stopped"


def list_runs(cluster: Cluster) -> list[RunRow]:
    where = where_of(cluster)
    readers = _readers(cluster, where)
    answers = remote.on_all(readers, lambda n: remote.run(n, _list_for(n, where), timeout=LIST_TIMEOUT_S))
    rows: dict[str, RunRow] = {}
    live: set[str] = set()
    for node in cluster.nodes:  # the launchers' pid files are on every node
        r = answers.get(node.name) or remote.run(node, _live_only(node), timeout=LIST_TIMEOUT_S)
        found, alive = parse_list(r.stdout)
        for rid, row in found.items():
            kept = rows.setdefault(rid, row)
            kept.exits.update(row.exits)
            kept.ended = max(filter(None, (kept.ended, row.ended)), default=None)
        live |= alive
    queue = _slurm_states(cluster)
    for row in rows.values():
        row.state = state_of(row, row.id in live, queue.get(row.id))
    return sorted(rows.values(), key=lambda r: r.id)


def _list_for(node: Node, where: layout.Where) -> str:
    return list_command(where, node.settings.training_user, node.settings.train_dir)


def _live_only(node: Node) -> str:
    return list_command(layout.Where("/nonexistent", False), None, node.settings.train_dir)


def as_training_user(user: str, command: str) -> str:
    """``command`` as the jobs ran: as the training user when the SSH user is root and the
    account exists (launch.plan.run_as_probe), else as the SSH user."""
    probe = launch_plan.run_as_probe(user)
    return f'if [ -n "$({probe})" ]; then {results.as_user(user, command)}; else sh -c {shlex.quote(command)}; fi'


def _slurm_states(cluster: Cluster) -> dict[str, str]:
    head = cluster.head_node()[0]
    if head.settings.slurm == "skip":
        return {}
    r = remote.run(head, "squeue -h -o '%j %T' 2>/dev/null; true", timeout=LIST_TIMEOUT_S)
    out = {}
    for line in r.stdout.splitlines():
        name, _, state = line.partition(" ")
        if name.startswith(slurm.JOB_NAME_PREFIX):
            out[name[len(slurm.JOB_NAME_PREFIX) :]] = state.strip()
    return out


def logs_command(where: layout.Where, run_id: str, node: str | None, follow: bool) -> str:
    """The job's log files (one node's, or all of them), followed with ``follow``."""
    logs_dir = f"{where.job_dir(run_id)}/logs"
    files = shlex.quote(f"{logs_dir}/{node}.log") if node else f"{shlex.quote(logs_dir)}/*.log"
    return f"tail -n +1 {'-F ' if follow else ''}{files}"


def cancel_commands(node: Node, run_id: str) -> str:
    """The run's processes on ``node`` stopped by the reaper (its recorded group, and what
    carries the run's markers), when the node has the run's directory."""
    s = node.settings
    run_dir = launch_plan.run_dir(s.train_dir, run_id, node.name)
    python = f"{s.venv_path}/bin/python"
    reap = shlex.join([python, "-I", f"{run_dir}/reaper.py", run_dir, run_id, node.name])
    return f"if [ -f {shlex.quote(run_dir)}/reaper.py ]; then {reap}; else echo '{{\"absent\": true}}'; fi"


def check_id(run_id: str) -> bool:
    return bool(RUN_ID.fullmatch(run_id))
