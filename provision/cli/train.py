"""`provision train`: run the reference DDP trainer on every node and report throughput."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision.cli.console import err, out, print_json, safe
from provision.cli.options import InventoryArg, LimitOpt
from provision.errors import EXIT_FAILED, InputError, Problem, ProvisionError

if TYPE_CHECKING:
    from provision.launch import Options


# --ckpt-every's default for an elastic run: a restart redoes at most this many steps,
# about a minute of a GPT-2-sized model on current GPUs and a few on slower setups, while
# a checkpoint every 100 steps costs little beside them.
ELASTIC_CKPT_EVERY = 100


class TrainFailed(ProvisionError):
    """A node could not be prepared; nothing was started."""


def train(
    inventory: Path = InventoryArg,
    extra: list[str] | None = typer.Argument(
        None, help="more train_ddp.py flags, after `--`, e.g. -- --lr 3e-4 --compile"
    ),
    nproc_per_node: str = typer.Option(
        "auto", "--nproc-per-node", help="ranks per node; auto: one per GPU, 1 without GPUs"
    ),
    steps: int = typer.Option(100, "--steps", min=1, max=10**9, help="optimizer steps in total"),
    model: str = typer.Option("tiny", "--model", help="trainer size preset: tiny, small, medium, gpt2"),
    batch_per_rank: int = typer.Option(
        8, "--batch-per-rank", min=1, max=65536, help="sequences per rank per step (global batch grows with ranks)"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue from the checkpoint's step"),
    limit: str | None = LimitOpt,
    python: str | None = typer.Option(
        None, "--python", help="interpreter on the nodes; default: <venv_path>/bin/python"
    ),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="controller directory for logs, reports and plots"),
    monitor_interval: float = typer.Option(
        5.0, "--monitor-interval", min=0.5, max=3600, help="seconds between node utilisation samples"
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", min=1, max=365 * 86400, help="stop the run (exit 1) after this many seconds"
    ),
    scheduler: str = typer.Option(
        "auto",
        "--scheduler",
        help="ssh: torchrun started on every node over SSH; slurm: the same run as one Slurm job "
        "(whole nodes, their GPUs; scancel on a failure or Ctrl-C); auto: slurm where the slurm "
        "step provisioned every host of the run and the controller answers, else ssh",
    ),
    requeue: bool = typer.Option(
        False,
        "--requeue",
        help="through Slurm only: let Slurm requeue the job (scontrol requeue, preemption); each start "
        "resumes from the run's last checkpoint (give -- --ckpt-interval N)",
    ),
    min_nodes: int | None = typer.Option(
        None,
        "--min-nodes",
        min=1,
        help="elastic: go on while this many nodes are left (torchrun --nnodes K:N, the rendezvous store "
        "on this machine); a lost node's survivors restart from the newest checkpoint. Default: all nodes, "
        "and the first failure ends the run",
    ),
    ckpt_every: int | None = typer.Option(
        None,
        "--ckpt-every",
        min=1,
        help=f"steps between checkpoints (default with --min-nodes: {ELASTIC_CKPT_EVERY}, a restart redoes "
        "at most that many; else only at the end)",
    ),
    drop_stragglers: float | None = typer.Option(
        None,
        "--drop-stragglers",
        metavar="F",
        help="with --min-nodes: take out a node whose own step time (less its wait for the others) stays above "
        "F x the other nodes' median for 20 steps, at the next checkpoint (named in the report); without it "
        "stragglers are only reported",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="do not echo the nodes' logs"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON on stdout"),
) -> None:
    """Train the bundled GPT on every host together (torchrun, c10d rendezvous on the first
    host's cluster address) and report per-node throughput, scaling efficiency against a
    recorded single-node run, resource use and stragglers.

    Logs stream live as "host rankN | ..." and are saved to runs/<run-id>/<host>.log,
    with report.json and train.png beside them. If any host fails, loses its SSH
    connection, or on Ctrl-C, the run is stopped on every host (by process group, never
    by name) and the exit code is 1.

    With --scheduler slurm (on a cluster the slurm step provisioned) the run is one job
    submitted as the training user: the same logs, report and exit codes; a failure or
    Ctrl-C cancels the job, and the reaper checks every node as after an SSH run. That is
    the default (auto) where Slurm runs on every host of the run; the first line says which
    scheduler was chosen, and why not Slurm when it was not.
    --requeue submits it requeueable: when Slurm requeues it, the logs go on across the
    attempts, every attempt resumes from the run's newest checkpoint, and the report says
    how many times it was requeued.

    Example: provision train inventories/testbed.py --steps 200 --model small -- --lr 3e-4

    --min-nodes K makes the run elastic (over SSH): when a node is lost, the others'
    workers restart from the run's newest checkpoint with the same global batch, while at
    least K nodes are left (exit 0 when every step ran, the lost nodes named; 1 when fewer
    than K were left or torchrun's restarts, the train_max_restarts setting, ran out).
    Its rendezvous store runs on this machine (it needs torch here), so losing any node,
    the first included, does not end the run. The report lists every restart.

    Example: provision train inventories/testbed.py --steps 200 --model small -- --lr 3e-4

    Example: provision train inventories/testbed.py --scheduler slurm --requeue --steps 2000 -- --ckpt-interval 100

    --drop-stragglers F (with --min-nodes) takes out a node whose own step time (its step
    less its wait for the others) stays above F times the other nodes' median for 20
    steps, at the next checkpoint; the others resume there without it. It is named in the
    report and not admitted again.

    Example: provision train inventories/testbed.py --min-nodes 1 --steps 2000 --ckpt-every 50

    Example: provision train inventories/testbed.py --min-nodes 1 --drop-stragglers 1.5
    """
    from provision import launch

    opts = _options(
        nproc_per_node,
        steps,
        model,
        batch_per_rank,
        resume,
        tuple(extra or ()),
        python,
        runs_dir,
        monitor_interval,
        timeout,
        inventory,
        scheduler,
        requeue,
        min_nodes,
        ckpt_every,
        drop_stragglers,
    )
    cluster = inventory_lib.load(inventory)
    nodes = host_limit.select(cluster, limit)
    if min_nodes is not None and min_nodes > len(nodes):
        raise InputError(Problem("--min-nodes", f"{min_nodes} is more than the run's {len(nodes)} node(s)"))
    if min_nodes is not None and scheduler == "auto":
        _say(nodes[0].name, "scheduler: ssh (an elastic run, --min-nodes, is started over SSH)")
        opts = replace(opts, scheduler="ssh")
    elif scheduler == "auto":
        from provision import scheduler as scheduler_lib

        opts = replace(opts, scheduler=scheduler_lib.choose(cluster, [n.name for n in nodes], _say), chosen=True)
        if requeue and opts.scheduler != "slurm":
            raise InputError(
                Problem("--requeue", "only a Slurm job can be requeued, and this run would go over SSH (above)")
            )
    elif scheduler == "slurm":
        from provision import scheduler as scheduler_lib

        outside = scheduler_lib.not_compute(cluster, [n.name for n in nodes])
        if outside:
            raise InputError(
                Problem(
                    "--scheduler slurm",
                    f"not Slurm compute nodes: {', '.join(outside)}",
                    "leave them out (--limit), or run over SSH (--scheduler ssh)",
                )
            )
    try:
        result = launch.train(cluster, nodes, opts, on_line=_echo(quiet), say=_say)
    except launch.LaunchError as e:
        raise TrainFailed(f"nothing started: {e}") from None
    if as_json:
        print_json(asdict(result))
    else:
        _print(result)
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)


def _options(
    nproc: str,
    steps: int,
    model: str,
    batch: int,
    resume: bool,
    extra: tuple[str, ...],
    python: str | None,
    runs_dir: Path,
    interval: float,
    timeout: float | None,
    inventory: Path,
    scheduler: str = "ssh",
    requeue: bool = False,
    min_nodes: int | None = None,
    ckpt_every: int | None = None,
    drop_stragglers: float | None = None,
) -> Options:
    from provision.launch import Options, logs, plan

    problems = []
    try:
        nproc_value = plan.parse_nproc(nproc)
    except ValueError:
        nproc_value = None
        problems.append(
            Problem("--nproc-per-node", f"{nproc!r} is not 'auto' or an integer from 1 to {plan.MAX_NPROC}")
        )
    sizes = plan.model_sizes()
    if model not in sizes:
        problems.append(Problem("--model", f"unknown size {model!r}", f"one of {', '.join(sizes)}"))
    if python is not None and not python.startswith("/"):
        problems.append(Problem("--python", f"{python!r} must be an absolute path on the nodes"))
    if why := logs.unwritable(runs_dir):  # before any node starts: logs and reports go there
        problems.append(
            Problem(f"--runs-dir {runs_dir}", f"cannot write there ({why})", "pass a directory you can write")
        )
    if scheduler not in ("auto", "ssh", "slurm"):
        problems.append(Problem("--scheduler", f"unknown scheduler {scheduler!r}", "auto, ssh or slurm"))
    elif requeue and scheduler == "ssh":
        problems.append(
            Problem(
                "--requeue",
                f"only a Slurm job can be requeued, not a run with --scheduler {scheduler}",
                "leave --scheduler ssh out, or --requeue",
            )
        )
    if min_nodes is not None and (scheduler == "slurm" or requeue):
        problems.append(
            Problem(
                "--min-nodes",
                "an elastic run is started over SSH, not as a Slurm job",
                "under Slurm, --requeue resumes a run from its checkpoint; else leave --scheduler slurm out",
            )
        )
    if drop_stragglers is not None and (min_nodes is None or not 1 < drop_stragglers <= 100):
        why = (
            "needs an elastic run (--min-nodes)"
            if min_nodes is None
            else f"{drop_stragglers:g}: F must be above 1 and at most 100 (100 x the median is already a stalled node)"
        )
        problems.append(Problem("--drop-stragglers", why, "e.g. --min-nodes 1 --drop-stragglers 1.5"))
    if problems:
        raise InputError(problems)
    return Options(
        steps,
        model,
        nproc_value,
        batch,
        resume,
        extra,
        python,
        runs_dir,
        interval,
        timeout,
        f"{inventory.stem}-{model}",
        scheduler,
        requeue,
        min_nodes=min_nodes,
        ckpt_every=ckpt_every if ckpt_every is not None else (ELASTIC_CKPT_EVERY if min_nodes is not None else 0),
        drop_stragglers=drop_stragglers,
    )


def _echo(quiet: bool) -> Callable[[str, str, str], None]:
    def on_line(host: str, who: str, text: str) -> None:
        if not quiet:
            err.print(f"[dim]{safe(host)} {safe(who)} |[/] {safe(text)}", soft_wrap=True)

    return on_line


def _say(host: str, text: str) -> None:
    err.print(f"[bold]{safe(host)}[/]: {safe(text)}")


def _print(r: Any) -> None:
    table = Table(title=f"{r.run_id}: {'ok' if r.ok else 'FAILED'}")
    for column in (
        "host",
        "ranks",
        "own tokens/s",
        "own step ms",
        "CPU mean/peak %",
        "RAM peak %",
        "GPU mean/peak %",
        "exit",
        "clean",
    ):
        table.add_column(column)
    for n in r.nodes:
        u = n.usage
        table.add_row(
            safe(n.name),
            ",".join(map(str, n.ranks)) or "-",
            _num(n.tokens_per_s),
            _num(n.own_step_ms, 1),
            f"{u.cpu_mean:.0f}/{u.cpu_peak:.0f}" if u else "-",
            f"{u.mem_peak:.0f}" if u else "-",
            f"{u.gpu_util_mean:.0f}/{u.gpu_util_peak:.0f}" if u and u.gpu_util_mean is not None else "-",
            "-" if n.exited is None else str(n.exited),
            {True: "yes", False: "NO", None: "?"}[n.clean],
        )
    out.print(table)
    out.print(
        f"throughput: {_num(r.tokens_per_s)} tokens/s over {r.world_size} ranks"
        + (f"; MFU {r.mfu:.1%}" if r.mfu else "")
    )
    if r.scaling_efficiency is not None:
        out.print(f"scaling efficiency: {r.scaling_efficiency:.2f} (against single-node run {r.scaling_reference})")
    if r.final_val_loss is not None:
        out.print(f"loss: train {r.final_train_loss:.4f}, validation {r.final_val_loss:.4f}")
    out.print(f"stragglers: {safe(', '.join(r.stragglers) or 'none')}")
    if r.requeues is not None:
        resumed = ", each next attempt resumed from the run's last checkpoint" if r.requeues else ""
        out.print(f"Slurm job requeued: {r.requeues} time(s){resumed}")
    if r.failure:
        out.print(f"[bold red]failed:[/] {safe(r.failure)}")
        if r.teardown_s is not None:
            out.print(f"stopped on every host in {r.teardown_s:.1f}s")
    for note in r.notes:
        out.print(f"note: {safe(note)}")
    out.print(f"logs, report.json and train.png: {safe(r.out_dir)}")
    if r.tensorboard:
        out.print(f"TensorBoard: tensorboard --logdir {safe(shlex.quote(r.tensorboard))}", soft_wrap=True)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"
