"""`provision run`, `runs`, `logs` and `cancel`: the user's own job on the cluster."""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision.cli import scheduling
from provision.cli.console import err, out, print_json, safe
from provision.cli.options import InventoryArg, LimitOpt
from provision.errors import EXIT_FAILED, InputError, Problem, ProvisionError


class RunFailed(ProvisionError):
    """No node could run the job; nothing was started."""


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("runs")(runs)
    app.command("logs")(logs)
    app.command("cancel")(cancel)


def run(
    inventory: Path = InventoryArg,
    task_or_command: list[str] | None = typer.Argument(
        None, help="a task file (TASK.yaml), or after -- the command to run on every node"
    ),
    nodes: int | None = typer.Option(None, "--nodes", min=1, max=4096, help="nodes the job runs on (num_nodes)"),
    gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", min=0, max=64, help="GPUs per node"),
    workdir: Path | None = typer.Option(
        None, "--workdir", help="local directory synced to the nodes; the job runs there"
    ),
    env: list[str] | None = typer.Option(None, "--env", help="K=V for the job's environment (repeat it)"),
    setup: str | None = typer.Option(None, "--setup", help="shell run once per node before the command"),
    name: str | None = typer.Option(None, "--name", help="the job's name in `provision runs`"),
    detach: bool = typer.Option(
        False, "--detach", help="start it and return; `provision logs RUN --follow` follows it"
    ),
    scheduler: str = typer.Option(
        "auto", "--scheduler", help="slurm, ssh, or auto: Slurm where it runs on every node and a share holds jobs"
    ),
    limit: str | None = LimitOpt,
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="controller directory for logs, reports, outputs"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="do not echo the nodes' lines"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON on stdout"),
) -> None:
    """Run your own job on N nodes: a SkyPilot-style task file, or a command after --.

    The workdir is synced to the cluster (a share every node mounts, else each node), a
    requirements.txt there (or the task's pip list) becomes a venv layered on the
    validated torch venv, built once as the job's user and cached by its hash; setup runs
    once per node, then run on every node with SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS,
    MASTER_ADDR, MASTER_PORT, NODE_RANK, NNODES, NPROC_PER_NODE, PROVISION_RUN_ID and
    PROVISION_RUN_DIR set. Every node's lines stream here and are saved; the first
    failing node, or Ctrl-C, stops the job on every node (exit 1). What the job writes
    to $PROVISION_RUN_DIR/outputs is copied back to runs/<id>/outputs when small, and
    JSON lines it writes to $PROVISION_METRICS are its metrics.

    Example: provision run inventories/testbed.py task.yaml

    Example: provision run inventories/testbed.py --nodes 2 --workdir . -- torchrun --nnodes 2 \\
    --node-rank \\$NODE_RANK --master-addr \\$MASTER_ADDR --master-port \\$MASTER_PORT train.py
    """
    from provision import jobs
    from provision.jobs import task as task_lib

    args = list(task_or_command or [])
    flags = _flags_mapping(nodes, gpus_per_node, workdir, env, setup, name)
    if args and args[0].endswith((".yaml", ".yml")):
        if len(args) > 1:
            raise InputError(
                Problem(
                    "provision run", f"a task file ({args[0]}) and a command", "give one: the file's run, or -- COMMAND"
                )
            )
        task = task_lib.load(Path(args[0]), flags)
    elif args:
        task = task_lib.from_mapping({"num_nodes": 1, **flags, "run": _command(args)}, "flags", Path.cwd())
    else:
        raise InputError(Problem("provision run", "no task file and no command", "give TASK.yaml, or -- COMMAND"))
    if scheduler not in ("auto", "ssh", "slurm"):
        raise InputError(Problem("--scheduler", f"unknown scheduler {scheduler!r}", "auto, ssh or slurm"))
    cluster = inventory_lib.load(inventory)
    candidates = host_limit.select(cluster, limit)
    compute = {n.name for n in cluster.compute_nodes()}
    candidates = [n for n in candidates if n.name in compute] or candidates
    chosen = scheduling.chosen(cluster, candidates, scheduler, _say, "the job")
    opts = jobs.Options(runs_dir=runs_dir, scheduler=chosen, detach=detach)
    try:
        report = jobs.run(cluster, candidates, task, opts, on_line=_echo(quiet), say=_say)
    except jobs.JobError as e:
        raise RunFailed(f"nothing started: {e}") from None
    if as_json:
        print_json(asdict(report))
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _command(args: list[str]) -> str:
    """One argument is a shell script as it is (`-- 'make train && ./eval.sh'`, as
    `sky exec` takes it); several are the words of one command, each kept whole."""
    return args[0] if len(args) == 1 else shlex.join(args)


def _flags_mapping(
    nodes: int | None,
    gpus: int | None,
    workdir: Path | None,
    env: list[str] | None,
    setup: str | None,
    name: str | None,
) -> dict[str, object]:
    """The flags given, as task keys: checked by the same rules as a task file's, and over
    its keys when both are given (as `sky launch` does)."""
    data: dict[str, object] = {}
    if nodes is not None:
        data["num_nodes"] = nodes
    if gpus is not None:
        data["resources"] = {"accelerators": f"GPU:{gpus}"} if gpus else {}
    if workdir is not None:
        data["workdir"] = str(workdir.resolve())  # from here, not from the task file's directory
    if env:
        data["envs"] = _env_pairs(env)
    if setup is not None:
        data["setup"] = setup
    if name is not None:
        data["name"] = name
    return data


def _env_pairs(env: list[str]) -> dict[str, str]:
    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(Problem(f"--env {item}", "not K=V"))
        pairs[key] = value
    return pairs


def _echo(quiet: bool):  # type: ignore[no-untyped-def]
    def on_line(host: str, who: str, text: str) -> None:
        if quiet:
            return
        if sys.stderr.isatty():
            err.print(f"[dim]{safe(host)} {safe(who)} |[/] {safe(text)}", soft_wrap=True)
        else:  # off a terminal: timestamped lines a log collector keeps
            err.print(f"{time.strftime('%H:%M:%S')} {safe(host)} {safe(who)} | {safe(text)}", soft_wrap=True)

    return on_line


def _say(host: str, text: str) -> None:
    err.print(f"[bold]{safe(host)}[/]: {safe(text)}")


def _print(r) -> None:  # type: ignore[no-untyped-def]
    state = "detached" if r.detached else ("ok" if r.ok else "FAILED")
    table = Table(title=f"{r.run_id} ({r.name}): {state}")
    for column in ("node", "exit"):
        table.add_column(column)
    for name, code in r.exits.items():
        table.add_row(safe(name), "-" if code is None else str(code))
    out.print(table)
    if r.failure:
        out.print(f"[bold red]failed:[/] {safe(r.failure)}")
        for line in r.last_lines[-10:]:
            out.print(f"  {safe(line)}", soft_wrap=True)
    if r.clean is not None:
        out.print(f"processes left on the nodes: {'none' if r.clean else 'SOME (see report.json: teardown)'}")
    if r.metrics:
        out.print("metrics (last): " + ", ".join(f"{safe(k)}={v:g}" for k, v in r.metrics.items()))
    out.print(f"environment: {safe(r.environment or 'the validated venv')}")
    for note in r.notes:
        out.print(f"note: {safe(note)}")
    if r.outputs:
        out.print(f"outputs: {safe(r.outputs)}")
    out.print(f"on the cluster: {safe(r.job_dir)}")
    if r.tensorboard:
        out.print(f"TensorBoard: tensorboard --logdir {safe(shlex.quote(r.tensorboard))}", soft_wrap=True)
    out.print(f"here: {safe(r.out_dir)} (logs, report.json)")


def runs(inventory: Path = InventoryArg, as_json: bool = typer.Option(False, "--json", help="JSON on stdout")) -> None:
    """List the cluster's jobs: id, name, user, nodes, state, started, duration, exit.

    Read from the cluster (the jobs' directories, Slurm's queue, the nodes' launchers),
    so a job started with --detach is listed after this machine was closed.

    Example: provision runs inventories/testbed.py
    """
    from provision.jobs import records

    rows = records.list_runs(inventory_lib.load(inventory))
    if as_json:
        print_json([asdict(r) for r in rows])
        return
    table = Table(title="jobs")
    for column in ("id", "name", "user", "nodes", "state", "started", "duration", "exit"):
        table.add_column(column)
    for r in rows:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)) if r.started else "?"
        end = r.ended if r.state not in ("running", "queued") else time.time()
        took = f"{(end - r.started) / 60:.1f} min" if r.started and end else "-"
        exits = ",".join(f"{k}={v}" for k, v in sorted(r.exits.items())) or "-"
        cells = (r.id, r.name, r.user, ",".join(r.nodes) or "?", r.state, started, took, exits)
        table.add_row(*(safe(x) for x in cells))
    out.print(table)


def logs(
    inventory: Path = InventoryArg,
    run_id: str = typer.Argument(..., help="the job's id (provision runs)"),
    node: str | None = typer.Option(None, "--node", help="one node's log; default: every node's"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep following until Ctrl-C"),
) -> None:
    """Show a job's logs from the cluster (every node's, or --node's).

    Example: provision logs inventories/testbed.py job-20261207-190000-abc123 --follow
    """
    from provision import remote
    from provision.jobs import records

    if not records.check_id(run_id):
        raise InputError(Problem(f"RUN {run_id}", "is not a job id (job-YYYYmmdd-HHMMSS-xxxxxx)"))
    cluster = inventory_lib.load(inventory)
    if node is not None and node not in {n.name for n in cluster.nodes}:
        raise InputError(Problem(f"--node {node}", "is not a host of the inventory"))
    where = records.where_of(cluster)
    reader = (
        next((n for n in cluster.nodes if n.name == node), cluster.nodes[0]) if not where.shared else cluster.nodes[0]
    )
    command = records.as_training_user(reader.settings.training_user, records.logs_command(where, run_id, node, follow))
    conn = remote.connection(reader)
    shown = _Shown()
    try:
        r = conn.run(
            command, hide=True, warn=True, pty=False, in_stream=False, out_stream=shown, timeout=None if follow else 120
        )
    except KeyboardInterrupt:
        return
    finally:
        shown.close()
        conn.close()
    if r.exited not in (0, None):
        raise typer.Exit(EXIT_FAILED)


class _Shown:
    """A job's log lines, written by the job's user, printed with what a terminal would
    act on (escape sequences) made visible."""

    def __init__(self) -> None:
        self._buf = ""

    def write(self, data: str) -> int:
        self._buf += data
        *lines, self._buf = self._buf.split("\n")
        for line in lines:
            out.print(safe(line.rstrip("\r")), soft_wrap=True, highlight=False)
        return len(data)

    def flush(self) -> None:
        return None

    def close(self) -> None:
        if self._buf:
            out.print(safe(self._buf), soft_wrap=True, highlight=False)
            self._buf = ""


def cancel(
    inventory: Path = InventoryArg, run_id: str = typer.Argument(..., help="the job's id (provision runs)")
) -> None:
    """Cancel a job: its Slurm job cancelled, and its processes stopped on every node (by
    the recorded process group and the run's markers, never by name).

    Example: provision cancel inventories/testbed.py job-20261207-190000-abc123
    """
    from provision import remote
    from provision.jobs import records, slurm

    if not records.check_id(run_id):
        raise InputError(Problem(f"RUN {run_id}", "is not a job id (job-YYYYmmdd-HHMMSS-xxxxxx)"))
    cluster = inventory_lib.load(inventory)
    head = cluster.head_node()[0]
    if head.settings.slurm != "skip":
        remote.run(
            head, records.as_training_user(head.settings.training_user, slurm.cancel_command(run_id, None)), timeout=60
        )
    answers = remote.on_all(
        list(cluster.nodes), lambda n: remote.run(n, records.cancel_commands(n, run_id), timeout=60)
    )
    left = []
    for name, r in answers.items():
        if r.exited == -1:
            left.append(f"{name} (unreachable)")
        elif '"left": [' in r.stdout and '"left": []' not in r.stdout:
            left.append(name)
    if left:
        out.print(f"[bold red]not stopped everywhere:[/] {safe(', '.join(left))}")
        raise typer.Exit(EXIT_FAILED)
    out.print(f"{safe(run_id)}: cancelled; no process of it is left on any node")
