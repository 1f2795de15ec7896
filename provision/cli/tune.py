"""`provision tune`: a hyperparameter sweep of the reference trainer over the cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision.cli import scheduling
from provision.cli.console import err, out, print_json, safe
from provision.cli.options import InventoryArg, LimitOpt
from provision.errors import EXIT_FAILED, InputError, Problem, ProvisionError

STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class TuneFailed(ProvisionError):
    """The sweep could not start; nothing ran."""


def tune(
    inventory: Path = InventoryArg,
    extra: list[str] | None = typer.Argument(
        None, help="more train_ddp.py flags for every trial, after `--`, e.g. -- --data-max-mb 1"
    ),
    space_file: Path | None = typer.Option(
        None, "--space", help="the reference trainer's search space: a TOML file of trainer flags and ranges"
    ),
    sweep_file: Path | None = typer.Option(
        None, "--sweep", help="a sweep of your own program: a YAML file in W&B's sweep keys (program, method, ...)"
    ),
    trials: int | None = typer.Option(
        None, "--trials", min=1, max=10_000, help="trials the study should finish (--sweep: default its run_cap)"
    ),
    parallel: int = typer.Option(
        2, "--parallel", min=1, max=1024, help="trials running at once, at most (one per slot)"
    ),
    sampler: str = typer.Option("tpe", "--sampler", help="tpe, random or grid"),
    pruner: str = typer.Option("median", "--pruner", help="median, hyperband or none"),
    study: str = typer.Option("sweep", "--study", help="the study's name: runs/tune/<study>/"),
    resume: bool = typer.Option(False, "--resume", help="continue the study: interrupted trials first"),
    steps: int = typer.Option(100, "--steps", min=1, help="optimizer steps of a trial that is not pruned"),
    eval_interval: int = typer.Option(10, "--eval-interval", min=1, help="steps between evaluations (pruning points)"),
    model: str = typer.Option("tiny", "--model", help="size preset unless the space searches model"),
    batch_per_rank: int = typer.Option(8, "--batch-per-rank", min=1, help="sequences per step (a trial is one rank)"),
    threads: int | None = typer.Option(
        None, "--threads", min=1, max=1024, help="CPU threads per trial (the trainer's --threads); default: torch's"
    ),
    per: str = typer.Option("gpu", "--slot", help="gpu: a slot per GPU on GPU nodes (node without GPUs: one); node"),
    scheduler: str = typer.Option(
        "auto",
        "--scheduler",
        help="slurm: each trial is a Slurm job placed by the scheduler (one GPU with --slot gpu on GPU "
        "nodes, else a whole node); ssh: the sweep's own queue of slots over SSH; auto: slurm where "
        "the slurm step provisioned every node of the sweep and the controller answers, else ssh",
    ),
    retries: int = typer.Option(2, "--retries", min=0, max=20, help="tries after a trial's first failure, elsewhere"),
    trial_timeout: float = typer.Option(
        7200, "--trial-timeout", min=10, max=30 * 86400, help="seconds a trial may run before it is stopped and failed"
    ),
    node_timeout: float = typer.Option(
        90, "--node-timeout", min=5, max=86400, help="seconds a node may not answer SSH before its trial fails as lost"
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, max=2**32 - 1, help="the sampler's seed (reproducible suggestions)"
    ),
    limit: str | None = LimitOpt,
    python: str | None = typer.Option(
        None, "--python", help="interpreter on the nodes; default <venv_path>/bin/python"
    ),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="controller directory; the study goes to tune/"),
    keep_checkpoints: bool = typer.Option(
        False,
        "--keep-checkpoints",
        help="keep every trial's own checkpoints (default: removed once the best is kept and evaluated)",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="do not echo the trials' logs"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON on stdout"),
) -> None:
    """Search the trainer's hyperparameters with Optuna, trials spread over the nodes.

    Each trial is the reference trainer, one rank, with flags sampled from the --space
    file; at most --parallel run at once. On a Slurm cluster (--scheduler auto finds it)
    each trial is a Slurm job the scheduler places; elsewhere each node, or each GPU of a
    GPU node, is a slot that trials reach over SSH. The first
    trial is the trainer's defaults, so the study shows what tuning gained. Each
    evaluation's validation loss goes to the study as it is printed; the pruner stops a
    hopeless trial (the trainer stops cleanly after its next evaluation). A trial whose
    node or rank fails is retried on another slot (--retries), and the study goes on.
    Ctrl-C stops every running trial on every node; --resume continues the study.

    At the end: a table of every trial, the best trial's checkpoint copied as the study's
    best (<checkpoint dir>/tune-<study>/best-step<N>.pt, with best.json) and evaluated
    again from the copy, runs/tune/<study>/report.html with Optuna's plots, and the
    optuna-dashboard command that opens the study. Exit 1 when no trial completed.

    Example: provision tune inventories/testbed.py --space space.toml --trials 8 --parallel 2 -- --data-max-mb 1

    --sweep tunes your own program instead: each trial is a one-node job (as `provision
    run`: the workdir synced, its requirements in a cached env) that gets its parameters as
    --name=value flags and writes its metric as JSON lines ({"step": 3, "val_loss": 2.1})
    to $PROVISION_METRICS; a JSON line it prints is an intermediate value for hyperband.
    The best trial's outputs are kept in runs/tune/<name>/best.

    Example: provision tune inventories/testbed.py --sweep sweep.yaml --trials 6 --parallel 2

    A space file: [lr] low = 1e-4 high = 3e-3 log = true / [warmup-steps] low = 0 high = 20 /
    [model] choices = ["tiny", "small"] (one table per trainer flag).
    """
    from provision.tune import results, space, sweep, trial
    from provision.tune import study as study_lib

    if sweep_file is not None and space_file is None:
        _program_sweep(
            inventory, sweep_file, trials, parallel, scheduler, seed, retries, limit, runs_dir, quiet, as_json
        )
        return
    space_file, trials = _space_and_trials(space_file, sweep_file, trials)
    problems = _check(sampler, pruner, study, per, model, python, runs_dir, eval_interval, steps, scheduler)
    problems += _reserved(tuple(extra or ()))
    try:
        searched = space.load(space_file, trials=trials, sampler=sampler)  # every problem at once
    except space.SpaceError as e:
        problems += [Problem(f"{space_file}: {p.split(':', 1)[0]}", p.split(":", 1)[-1].strip()) for p in e.problems]
        searched = None
    if problems or searched is None:
        raise InputError(problems)
    cluster = inventory_lib.load(inventory)
    nodes = (
        host_limit.select(cluster, limit)
        if limit is not None
        else (cluster.with_role("compute") or list(cluster.nodes))
    )
    scheduler = scheduling.chosen(cluster, nodes, scheduler, _say, "a trial")
    study_dir = runs_dir / "tune" / study
    settings = trial.TrialSettings(
        study=study,
        steps=steps,
        model=model,
        batch_per_rank=batch_per_rank,
        eval_interval=eval_interval,
        threads=threads,
        extra=tuple(extra or ()),
        python=python,
        runs_dir=study_dir / "trials",
        timeout_s=trial_timeout,
        node_timeout_s=node_timeout,
    )
    opts = sweep.SweepOptions(
        trials=trials,
        parallel=parallel,
        sampler=sampler,
        pruner=pruner,
        study=study,
        resume=resume,
        retries=retries,
        seed=seed,
        per_gpu=per == "gpu",
        study_dir=study_dir,
        settings=settings,
        scheduler=scheduler,
    )
    on_line = _echo(quiet)
    try:
        result, st = sweep.run(cluster, nodes, searched, opts, on_line, _say)
    except sweep.SweepError as e:
        raise TuneFailed(str(e)) from None
    by_name = {n.name: n for n in nodes if n.name not in result.lost_nodes}
    best, removed = None, None
    if not result.interrupted:  # an interrupted study keeps every checkpoint for --resume
        best, removed = _keep_best(st, study, by_name, settings, cluster, keep_checkpoints, on_line)
    rows = results.rows(st)
    summary = results.Summary(
        study=study,
        study_dir=str(study_dir),
        rows=rows,
        best=best,
        default_value=results.default_value(st),
        counts=results.counts(rows),
        dashboard=study_lib.dashboard_command(study_dir),
        removed_checkpoints=removed,
        notes=[
            *st.user_attrs.get("defaults_outside", []),
            *result.notes,
            *([f"stopped: {result.stopped_why}"] if result.stopped_why else []),
        ],
    )
    if result.lost_nodes:
        summary.notes.append(f"lost: {', '.join(result.lost_nodes)}")
    results.write(summary, st, study_dir)
    if as_json:
        from dataclasses import asdict

        print_json(asdict(summary))
    else:
        _print(summary)
    if result.interrupted:
        err.print(f"interrupted: continue with --resume --study {safe(study)}")
        raise typer.Exit(EXIT_FAILED)
    if best is None or best.problem:
        raise typer.Exit(EXIT_FAILED)


def _keep_best(
    st: Any,
    study: str,
    nodes: dict[str, inventory_lib.Node],
    settings: Any,
    cluster: inventory_lib.Cluster,
    keep_checkpoints: bool,
    on_line: Any,
) -> tuple[Any, int | None]:
    """The best kept and evaluated again; then, unless kept, the trials' own checkpoints
    removed (only once the best is safe in its own directory). (best, files removed)."""
    from provision.tune import results

    nfs = cluster.storage_node() is not None
    best = results.keep_best(st, study, nodes, settings, nfs_server=nfs, on_line=on_line, say=_say)
    if best is None or best.problem is not None or keep_checkpoints:
        return best, None
    return best, results.remove_trial_checkpoints(st, study, nodes, _say)


def _space_and_trials(space: Path | None, sweep: Path | None, trials: int | None) -> tuple[Path, int]:
    """The reference trainer's study needs its space file and a trial count."""
    if space is None or sweep is not None:
        raise InputError(Problem("provision tune", "give --space (the reference trainer) or --sweep (your program)"))
    if trials is None:
        raise InputError(Problem("--trials", "is required with --space", "e.g. --trials 8"))
    return space, trials


def _program_sweep(
    inventory: Path,
    sweep_file: Path,
    trials: int | None,
    parallel: int,
    scheduler: str,
    seed: int | None,
    retries: int,
    limit: str | None,
    runs_dir: Path,
    quiet: bool,
    as_json: bool,
) -> None:
    """--sweep: any program, its trials as one-node jobs (tune/programs.py)."""
    from dataclasses import asdict

    from provision.tune import programs
    from provision.tune import sweep_file as sweep_lib

    swept = sweep_lib.load(sweep_file)
    count = trials or swept.run_cap or (sweep_lib.grid_size(swept) if swept.method == "grid" else None)
    if count is None:
        raise InputError(Problem("--trials", "is required (the sweep file has no run_cap)", "e.g. --trials 8"))
    if scheduler not in ("auto", "ssh", "slurm"):
        raise InputError(Problem("--scheduler", f"unknown scheduler {scheduler!r}", "auto, ssh or slurm"))
    cluster = inventory_lib.load(inventory)
    nodes = host_limit.select(cluster, limit) if limit is not None else (cluster.compute_nodes() or list(cluster.nodes))
    chosen = scheduling.chosen(cluster, nodes, scheduler, _say, "a trial")
    opts = programs.ProgramOptions(runs_dir / "tune" / swept.name, count, parallel, chosen, seed, retries)
    result = programs.run(cluster, nodes, swept, opts, _say, _echo(quiet))
    if as_json:
        print_json(asdict(result))
    else:
        _print_program(result)
    if result.best is None:
        raise typer.Exit(EXIT_FAILED)


def _print_program(r: Any) -> None:
    table = Table(title=f"sweep {r.name}: {r.metric} ({r.goal})")
    for column in ("trial", "state", r.metric, "node", "parameters", "why"):
        table.add_column(column)
    for row in r.rows:
        value = "-" if row.value is None else f"{row.value:g}"
        params = " ".join(f"{k}={v}" for k, v in row.params.items())
        table.add_row(str(row.number), row.state, value, safe(row.node or "-"), safe(params), safe(row.why))
    out.print(table)
    if r.best is not None:
        out.print(f"best: trial {r.best.number}, {r.metric} {r.best.value:g}, {safe(str(r.best.params))}")
    if r.best_outputs:
        out.print(f"best trial's outputs: {safe(r.best_outputs)}")
    if r.failure:
        out.print(f"[bold red]stopped:[/] {safe(r.failure)}")
    out.print(f"study: {safe(r.study_dir)} (tune.json)")


def _check(
    sampler: str,
    pruner: str,
    study: str,
    per: str,
    model: str,
    python: str | None,
    runs_dir: Path,
    eval_interval: int,
    steps: int,
    scheduler: str,
) -> list[Problem]:
    from provision.launch import logs, plan
    from provision.tune import study as study_lib

    problems = []
    if scheduler not in ("auto", "ssh", "slurm"):
        problems.append(Problem("--scheduler", f"unknown scheduler {scheduler!r}", "auto, ssh or slurm"))
    if sampler not in study_lib.SAMPLERS:
        problems.append(Problem("--sampler", f"unknown sampler {sampler!r}", ", ".join(study_lib.SAMPLERS)))
    if pruner not in study_lib.PRUNERS:
        problems.append(Problem("--pruner", f"unknown pruner {pruner!r}", ", ".join(study_lib.PRUNERS)))
    if not STUDY_NAME.fullmatch(study):
        problems.append(Problem("--study", f"{study!r}: letters, digits, '.', '_' and '-', at most 64, no leading dot"))
    if per not in ("gpu", "node"):
        problems.append(Problem("--slot", f"{per!r} is not gpu or node"))
    if model not in plan.model_sizes():
        problems.append(Problem("--model", f"unknown size {model!r}", f"one of {', '.join(plan.model_sizes())}"))
    if python is not None and not python.startswith("/"):
        problems.append(Problem("--python", f"{python!r} must be an absolute path on the nodes"))
    if eval_interval > steps:
        problems.append(
            Problem("--eval-interval", f"{eval_interval} is more than --steps {steps}: no trial could be pruned")
        )
    if why := logs.unwritable(runs_dir):
        problems.append(Problem(f"--runs-dir {runs_dir}", f"cannot write there ({why})"))
    return problems


# Trainer flags the sweep sets for every trial: given after `--` they would win (the last
# flag wins) and quietly break the sweep (--stop-file: no pruning; --steps: another budget).
RESERVED = (
    "--steps", "--eval-interval", "--stop-file", "--ckpt-name", "--summary", "--run-id", "--resume",
    "--auto-resume", "--auto-resume-own", "--eval-only",
)  # fmt: skip


def _reserved(extra: tuple[str, ...]) -> list[Problem]:
    problems = []
    for word in extra:
        flag = word.split("=", 1)[0]
        # A prefix is refused too: argparse took "--step" for --steps before the trainer
        # stopped abbreviations, and a trainer of the user's own may still take them.
        flag = next((r for r in RESERVED if flag.startswith("--") and len(flag) > 2 and r.startswith(flag)), flag)
        if flag in RESERVED:
            own = {"--steps": "--steps", "--eval-interval": "--eval-interval"}.get(flag)
            how = f"use tune's {own}" if own else "the sweep sets it for every trial"
            problems.append(Problem(f"-- {flag}", f"not a flag to pass through: {how}"))
    return problems


def _echo(quiet: bool) -> Any:
    def on_line(slot: str, who: str, text: str) -> None:
        if not quiet:
            err.print(f"[dim]{safe(slot)} {safe(who)} |[/] {safe(text)}", soft_wrap=True)

    return on_line


def _say(who: str, text: str) -> None:
    err.print(f"[bold]{safe(who)}[/]: {safe(text)}", soft_wrap=True)


def _print(s: Any) -> None:
    table = Table(title=f"study {s.study}: " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(s.counts.items())))
    for column in ("#", "state", "val loss", "flags", "slot", "s", "note"):
        table.add_column(column)
    from provision.tune import trial

    for r in s.rows:
        note = "defaults" if r.default else (f"retry of {r.retry_of}" if r.retry_of is not None else "")
        if r.reason and r.state != "COMPLETE":
            note = f"{note}; {r.reason}" if note else r.reason
        table.add_row(
            str(r.number),
            r.state.lower(),
            "-" if r.value is None else f"{r.value:.4f}",
            safe(trial.flags_text(r.params)),
            safe(f"{r.slot or '-'} (job {r.slurm_job})" if r.slurm_job else (r.slot or "-")),
            "-" if r.seconds is None else f"{r.seconds:.0f}",
            safe(note[:120]),
        )
    out.print(table)
    b = s.best
    if b is None:
        out.print("best: no trial completed")
    else:
        gained = f" (the defaults: {s.default_value:.4f})" if s.default_value is not None else ""
        flags = safe(trial.flags_text(b.params))
        out.print(f"best: trial {b.number}, val loss {b.value:.4f}{gained}: {flags}")
        if b.checkpoint:
            again = f"; evaluated again from it: {b.evaluated:.4f}" if b.evaluated is not None else ""
            out.print(f"kept as {safe(b.checkpoint)} on {safe(b.slot)}{again}")
        if b.problem:
            out.print(f"[bold red]best not kept whole:[/] {safe(b.problem)}")
    if s.removed_checkpoints is not None:
        out.print(f"removed {s.removed_checkpoints} trial checkpoint(s); --keep-checkpoints keeps them")
    for note in s.notes:
        out.print(f"note: {safe(note)}")
    out.print(f"report: {safe(s.report_html)}")
    out.print(f"live study: {safe(s.dashboard)}")
