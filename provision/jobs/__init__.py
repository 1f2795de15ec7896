"""`provision run`: the user's own job on N nodes of the cluster.

    report = jobs.run(cluster, candidates, task, Options(...), on_line=print_line, say=progress)

Modules: ``task`` (the task file and its checks, pure), ``layout`` (where a job lives and
the shell it runs, pure), ``slurm`` (the allocation's script, pure), ``bundle`` (the
workdir packed, outputs unpacked), ``nodes`` (each node checked, free ones picked),
``runner`` (prepare, run, stream, teardown), ``results`` (metrics, exits, outputs),
``records`` (runs, logs and cancel from the cluster's own files).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision import remote
from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node
from provision.jobs import bundle, layout, nodes, results, runner
from provision.jobs.task import Task
from provision.rules.frameworks import REMOTE_WHEELHOUSE

__all__ = ["JobReport", "Options", "Task", "run"]


class JobError(Exception):
    """No node could run the job; nothing was started."""


@dataclass
class Options:
    runs_dir: Path  # controller directory: runs/<id>/ gets the logs, report.json and outputs
    scheduler: str  # "ssh" or "slurm" (already chosen)
    detach: bool = False  # start and return; `provision logs` follows it
    copy_max: int = results.OUTPUTS_COPY_MAX  # outputs past this stay on the cluster
    stop: threading.Event | None = None  # set by the caller (a sweep's pruner): the job is torn down


@dataclass
class JobReport:
    """What `provision run` says at the end, and writes as report.json."""

    run_id: str
    name: str
    scheduler: str
    nodes: list[str]
    ok: bool
    job_dir: str  # PROVISION_RUN_DIR on the cluster
    out_dir: str  # runs/<id> here
    exits: dict[str, int | None] = field(default_factory=dict)
    failure: str | None = None
    failed_node: str | None = None
    last_lines: list[str] = field(default_factory=list)  # the failing node's
    clean: bool | None = None  # no process of the job left on any node
    metrics: dict[str, float] = field(default_factory=dict)  # last value of each
    best: dict[str, float] = field(default_factory=dict)  # lowest value of each
    outputs: str | None = None  # the local copy
    tensorboard: str | None = None  # the events directory on the cluster
    environment: str | None = None  # the job's venv on the cluster (None: the validated venv)
    first_line_s: float | None = None  # from the start of `run` to the job's first line
    duration_s: float = 0.0
    detached: bool = False
    notes: list[str] = field(default_factory=list)


def run(
    cluster: Cluster,
    candidates: list[Node],
    task: Task,
    opts: Options,
    on_line: runner.OnLine,
    say: Callable[[str, str], None],
) -> JobReport:
    """The task on ``task.num_nodes`` of ``candidates``. Raises JobError when nothing could
    start; a job that started and failed is a report with ok=False."""
    started = time.monotonic()
    if task.num_nodes > len(candidates):
        raise InputError(
            Problem(f"{task.source}: num_nodes", f"{task.num_nodes} is more than the {len(candidates)} node(s) here")
        )
    run_id = layout.new_run_id()
    out_dir = (opts.runs_dir / run_id).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    first = candidates[0].settings
    where = layout.where(first, cluster.storage_node() is not None)
    if opts.scheduler == "slurm" and not where.shared:
        say(
            candidates[0].name,
            "scheduler: ssh after all (a Slurm job needs a share every node mounts: runs or scratch)",
        )
        opts.scheduler = "ssh"
    local = [t for t, _ in task.file_mounts if not where.on_share(t)]
    if opts.scheduler == "slurm" and local:
        raise InputError(
            Problem(
                f"{task.source}: file_mounts",
                f"{', '.join(local)} is on each node's own disk, and Slurm picks the nodes only once the job starts",
                f"mount onto a share (under {where.mount_root}), or run with --scheduler ssh",
            )
        )
    base_python = f"{first.venv_path}/bin/python"
    packs = _pack(task, out_dir, say, candidates[0].name)
    conns = {n.name: remote.connection(n) for n in candidates}
    addresses = {n.name: n.cluster_address for n in cluster.all_nodes}  # Slurm's node names are the inventory's
    try:
        plan, chosen = _plan(cluster, candidates, conns, task, opts, run_id, where, base_python, say)
        _upload(plan, packs, conns)
        report = _run(plan, chosen, conns, opts, out_dir, on_line, say, started, addresses)
    finally:
        for c in conns.values():
            c.close()
    (out_dir / "report.json").write_text(json.dumps(asdict(report), indent=1, default=str))
    return report


def _plan(
    cluster: Cluster,
    candidates: list[Node],
    conns: dict[str, Any],
    task: Task,
    opts: Options,
    run_id: str,
    where: layout.Where,
    base_python: str,
    say: Callable[[str, str], None],
) -> tuple[layout.JobPlan, dict[str, Node]]:
    count = task.num_nodes if opts.scheduler == "ssh" else 1  # Slurm places the job; one node submits it
    chosen, passed = _checked(candidates, conns, run_id, base_python, count, task.gpus_per_node, say)
    if len(chosen) < count:
        raise JobError(f"{len(chosen)} of {task.num_nodes} node(s) free to run it: " + "; ".join(passed))
    by_name = {n.name: n for n in candidates}
    s = by_name[chosen[0].name].settings
    requirements = layout.requirements_text(task, _workdir_requirements(task))
    plan = layout.JobPlan(
        run_id=run_id,
        task=task,
        where=where,
        nodes=tuple(chosen),
        port=s.train_master_port,
        base_python=base_python,
        requirements=requirements,
        find_links=REMOTE_WHEELHOUSE if s.wheelhouse else None,
        index_url=s.pip_index_url,
    )
    return plan, {j.name: by_name[j.name] for j in chosen}


def _checked(
    candidates: list[Node],
    conns: dict[str, Any],
    run_id: str,
    base_python: str,
    count: int,
    gpus: int,
    say: Callable[[str, str], None],
) -> tuple[list[layout.NodeJob], list[str]]:
    """The nodes checked and picked. Over SSH every candidate is checked at once; a Slurm
    job needs one node to submit it, so candidates are checked one at a time until one can."""
    names = [n.name for n in candidates]
    groups = [candidates] if count > 1 or len(candidates) == 1 else [[n] for n in candidates]
    probed: dict[str, nodes.Probed] = {}
    for group in groups:
        for n in group:
            say(n.name, "checking python, interface, GPUs and whether it is busy")
        probed |= remote.on_all(group, lambda n: nodes.probe(n, conns[n.name], run_id, base_python))
        chosen, passed = nodes.pick(probed, [n for n in names if n in probed], count, gpus)
        if len(chosen) >= count:
            return chosen, passed
    return nodes.pick(probed, names, count, gpus)


def _workdir_requirements(task: Task) -> str | None:
    if task.workdir is None:
        return None
    path = task.workdir / "requirements.txt"
    if not path.is_file():
        return None
    if path.stat().st_size > 1 << 20:
        raise InputError(Problem(str(path), "over 1 MiB: not a requirements file"))
    return path.read_text(errors="replace")


def _pack(task: Task, out_dir: Path, say: Callable[[str, str], None], who: str) -> list[tuple[Path, str]]:
    """The workdir and file mounts packed here, before any node is touched: a tree past its
    bound is bad input with nothing started."""
    packs: list[tuple[Path, str]] = []
    upload = out_dir / "upload"
    upload.mkdir(exist_ok=True)
    if task.workdir is not None:
        packed = bundle.pack(task.workdir, upload / "workdir.tar.gz", task.include)
        say(who, f"workdir: {packed.files} file(s), {packed.size / 2**20:.1f} MiB")
        for left in packed.left_out:
            say(who, f"workdir: not synced: {left} (include: [PATH] in the task syncs it)")
        packs.append((packed.path, "workdir.tar.gz"))
    for i, (target, source) in enumerate(task.file_mounts):
        packed = bundle.pack(source, upload / f"mount-{i}.tar.gz", where=f"file_mounts.{target}")
        packs.append((packed.path, f"mount-{i}.tar.gz"))
    return packs


def _upload(plan: layout.JobPlan, packs: list[tuple[Path, str]], conns: dict[str, Any]) -> None:
    """Each pack put in the nodes' root-owned run directories: a shared workdir, and mounts
    onto a share, on the first node only (it unpacks them for all)."""
    for i, job in enumerate(plan.nodes):
        for local, name in packs:
            if i == 0 or (not (plan.where.shared and name == "workdir.tar.gz") and not _mount_on_share(plan, name)):
                conns[job.name].put(str(local), f"{job.run_dir}/{name}")


def _mount_on_share(plan: layout.JobPlan, name: str) -> bool:
    if not name.startswith("mount-"):
        return False
    target = plan.task.file_mounts[int(name.split("-")[1].split(".")[0])][0]
    return plan.where.on_share(target)


@dataclass
class _Job:
    """One job's run, as the functions below share it."""

    plan: layout.JobPlan
    chosen: dict[str, Node]  # the nodes the job runs on (under Slurm: the one that submits it)
    conns: dict[str, Any]  # one SSH connection a node
    opts: Options
    out_dir: Path  # runs/<id> here
    on_line: runner.OnLine
    say: Callable[[str, str], None]
    started: float  # monotonic, when `run` began
    report: JobReport
    ran: runner.Ran = field(default_factory=runner.Ran)

    @property
    def first(self) -> layout.NodeJob:
        return self.plan.nodes[0]

    def on_first(self, command: str) -> remote.CommandResult:
        """A command on the first node, as the job's user."""
        job = self.first
        return remote.run(self.chosen[job.name], results.as_user(job.run_as, command), 60, self.conns[job.name])


def _run(
    plan: layout.JobPlan,
    chosen: dict[str, Node],
    conns: dict[str, Any],
    opts: Options,
    out_dir: Path,
    on_line: runner.OnLine,
    say: Callable[[str, str], None],
    started: float,
    addresses: dict[str, str],
) -> JobReport:
    names = [j.name for j in plan.nodes]
    report = JobReport(plan.run_id, plan.task.name, opts.scheduler, names, False, plan.job_dir, str(out_dir))
    report.environment = plan.env_dir
    job = _Job(plan, chosen, conns, opts, out_dir, on_line, say, started, report)
    if opts.scheduler == "slurm":
        return _run_slurm(job, addresses)
    say(names[0], f"{plan.run_id}: {plan.task.name} on {', '.join(names)} (over SSH); PROVISION_RUN_DIR={plan.job_dir}")
    if not runner.prepare(plan, chosen, conns, out_dir, on_line, job.ran, _record(job)):
        return _finish(job)
    if opts.detach:
        for node in plan.nodes:
            command = layout.launcher(plan, node, layout.run_script(plan, node), detach=True)
            remote.run(chosen[node.name], command, timeout=60, conn=conns[node.name])
        report.ok, report.detached = True, True
        report.notes.append(f"detached: follow it with `provision logs INVENTORY {plan.run_id} --follow`")
        return report
    run_started = time.monotonic()
    job.ran.ends.clear()
    runner.run_ssh(plan, chosen, conns, out_dir, on_line, job.ran, plan.task.time_limit_s, opts.stop)
    if job.ran.first_line_at is not None:
        report.first_line_s = job.ran.first_line_at - run_started
    if job.ran.failure is None:
        runner.teardown(plan, chosen, conns, job.ran, check=True)
    return _finish(job)


def _run_slurm(job: _Job, addresses: dict[str, str]) -> JobReport:
    from provision.jobs import slurm

    plan, first, report, ran = job.plan, job.first, job.report, job.ran
    submit = job.chosen[first.name]
    job.say(
        first.name,
        f"{plan.run_id}: {plan.task.name} on {plan.task.num_nodes} node(s) through Slurm "
        f"(submitted from {first.name}); PROVISION_RUN_DIR={plan.job_dir}",
    )
    if not runner.prepare(_first_only(plan), job.chosen, job.conns, job.out_dir, job.on_line, ran, _record(job)):
        return _finish(job)
    ran.ends.clear()
    conn = job.conns[first.name]
    if job.opts.detach:
        r = remote.run(submit, slurm.detached_command(plan, first.run_as, addresses), timeout=60, conn=conn)
        report.ok, report.detached = r.ok, True
        report.notes.append(f"sbatch: {r.stdout.strip() or r.stderr.strip()[-300:]}")
        return report
    run_started = time.monotonic()
    runner.run_slurm(plan, submit, conn, addresses, job.out_dir, job.on_line, ran, first.run_as, job.opts.stop)
    if ran.first_line_at is not None:
        report.first_line_s = ran.first_line_at - run_started
    end = ran.ends.get("slurm")
    if ran.failure is None and end is not None and end.exited != 0:
        ran.failure = f"the Slurm job failed (exit {end.exited}{'; ' + end.reason if end.reason else ''})"
    return _finish(job, slurm_job=True)


def _record(job: _Job) -> str:
    """The run's job.json (the first node writes it into the job directory, as the job's
    user): what `provision runs` lists."""
    plan, first = job.plan, job.first
    record = {
        "id": plan.run_id,
        "name": plan.task.name,
        "user": first.run_as or job.chosen[first.name].ssh.user,
        "nodes": [j.name for j in plan.nodes] if job.opts.scheduler == "ssh" else plan.task.num_nodes,
        "scheduler": job.opts.scheduler,
        "started": time.time(),
    }
    return json.dumps(record)


def _first_only(plan: layout.JobPlan) -> layout.JobPlan:
    """The plan whose preparation unpacks the workdir and builds the env on the submitting
    node, once for all (the allocation runs setup on every node itself)."""
    from dataclasses import replace

    return replace(plan, nodes=plan.nodes[:1], task=replace(plan.task, setup=None))


def _finish(job: _Job, slurm_job: bool = False) -> JobReport:
    """Exits, metrics and outputs read back from the cluster (as the job's user), and the
    report made. Under Slurm, the nodes are those that wrote an exit status."""
    plan, report, ran = job.plan, job.report, job.ran
    exits = results.parse_exits(job.on_first(results.exits_command(plan.job_dir)).stdout)
    if slurm_job:
        report.nodes = sorted(exits) or report.nodes
        report.exits = {n: exits[n] for n in sorted(exits)}
    else:
        report.exits = {n: exits.get(n, ran.ends[n].exited if n in ran.ends else None) for n in report.nodes}
    report.failure, report.failed_node = ran.failure, ran.failed_node
    if ran.failed_node and ran.failed_node in ran.ends:
        report.last_lines = ran.ends[ran.failed_node].last
    report.ok = ran.failure is None and bool(report.exits) and all(v == 0 for v in report.exits.values())
    if ran.teardown:
        report.clean = all(not t.get("left") for t in ran.teardown.values() if "left" in t)
    parsed = results.parse_metrics(job.on_first(results.metrics_command(plan.job_dir)).stdout)
    report.metrics, report.best = parsed.last, parsed.best
    conn = job.conns[job.first.name]
    report.outputs, notes = results.fetch(
        conn, job.first.run_as, plan.job_dir, job.out_dir / "outputs", job.opts.copy_max
    )
    report.notes += notes
    events = job.on_first(results.events_command(plan.job_dir)).stdout.strip()
    report.tensorboard = f"{plan.job_dir}/tb" if events.isdigit() and int(events) else None
    report.duration_s = time.monotonic() - job.started
    return report
