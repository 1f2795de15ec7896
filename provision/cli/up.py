"""`provision up`, `provision plan`, `provision verify`: apply, preview and check the
desired state of every host. Thin: the work is in provision.up.pipeline and provision.verify."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision import state
from provision.cli.console import err, host_progress, out, plain, print_json, safe
from provision.cli.options import InventoryArg, JsonOpt, LimitOpt, ProgressChoice, ProgressOpt
from provision.engine import HostPlan, RunReport
from provision.errors import EXIT_FAILED, EXIT_OK, InputError, Problem
from provision.up import host_lock, pipeline

_STEPS = ", ".join(pipeline.step_names())
OnlyOpt = typer.Option(None, "--only", help=f"comma-separated steps to run ({_STEPS}); preflight always runs")
SkipOpt = typer.Option(None, "--skip", help="comma-separated steps to leave out")


def up(
    inventory: Path = InventoryArg,
    only: str = OnlyOpt,
    skip: str = SkipOpt,
    reboot_batch: int = typer.Option(
        None, "--reboot-batch", min=1, help="most hosts rebooting at once (default: a quarter, at least 1)"
    ),
    force_format: list[str] = typer.Option(
        [],
        "--force-format",
        metavar="HOST:DISK",
        help="allow the volumes step to erase this disk although it holds data (repeatable; "
        "DISK as in data_disks: a /dev/disk/by-id path or a serial)",
    ),
    limit: str = LimitOpt,
    canary: int = typer.Option(0, "--canary", min=0, help="run every step on N hosts first; stop if one fails"),
    wave_size: int = typer.Option(
        0, "--wave-size", min=0, help="then hosts N at a time (default: all the rest at once)"
    ),
    max_fail: str = typer.Option(
        "0", "--max-fail", help="stop after a wave in which more than this share failed: 0 (default), 5%, 0.05"
    ),
    as_json: bool = JsonOpt,
    progress_mode: ProgressChoice = ProgressOpt,
) -> None:
    """Bring every host to the desired state: preflight, base, nvidia, frameworks, then
    the storage steps. Hosts run in parallel; a host that fails stops there and the others
    go on. Hosts that need it reboot after the nvidia step, a batch at a time, never the
    machine running provision. A second run changes nothing.

    Deadlines (settings connect_timeout_s, command_timeout_s, step_timeout_s): a host past
    one is reported "timed out in <step> after N s" and the others go on. One `up` per
    inventory at a time: a second one exits 2 naming the holder's pid and start time.
    Off a terminal (CI, nohup) progress is one line per host and step event on stderr.

    Exit code: 0 all hosts done, 1 some host failed or timed out, 2 bad input or another
    `up` holds the inventory (nothing touched), 130 interrupted (Ctrl-C; the hosts that
    were mid-step are named; run `up` again to finish).

    --limit runs on some hosts only (names, globs, groups); what the cluster shares
    (/etc/hosts, the training user's known hosts) still lists every host.

    Staged: --canary N runs every step on N hosts first (the storage host among them) and
    stops if one fails; the rest follow in waves of --wave-size, stopping after a wave
    where more than --max-fail of the hosts failed. Hosts never reached are reported
    "not run" with the reason.

    Example: provision up inventories/fleet.py --canary 2 --wave-size 50 --max-fail 2%
    """
    from provision.up.force_format import apply_force_format
    from provision.up.rollout import Rollout, parse_max_fail

    rollout = Rollout(canary, wave_size, parse_max_fail(max_fail))
    cluster = host_limit.apply(apply_force_format(inventory_lib.load(inventory), force_format), limit)
    steps = pipeline.select(only, skip)
    pipeline.check_inputs(cluster, steps)  # bad input is said before any progress display
    with (
        state.inventory_lock(inventory),
        host_progress([n.name for n in cluster.nodes], enabled=not as_json, mode=progress_mode.value) as progress,
        host_lock.held(cluster) as locks,
    ):
        report = pipeline.up(cluster, steps, on_event=progress, reboot_batch=reboot_batch, rollout=rollout, locks=locks)
    if as_json:
        print_json(report.as_json() | {"steps": [s.name for s in steps]})
    else:
        print_summary(report)
    raise typer.Exit(report.exit_code)


def print_summary(report: RunReport) -> None:
    table = Table(title="provision up")
    for column in ("host", "steps done", "changed", "rebooted", "result"):
        table.add_column(column)
    for h in report.hosts.values():
        failures = [safe(f) for f in h.failures] or ["unreachable"]
        result = "[green]ok[/]" if h.ok else "[red]" + "\n".join(failures) + "[/]"
        if h.notes:
            result += "\n[dim]" + "\n".join(safe(n) for n in h.notes) + "[/]"
        table.add_row(safe(h.name), ", ".join(h.steps) or "-", str(h.changed), "yes" if h.rebooted else "no", result)
    out.print(table)
    total = sum(h.changed for h in report.hosts.values())
    failed = [h.name for h in report.hosts.values() if not h.ok]
    out.print(
        f"{total} operations changed; " + (f"[red]failed: {safe(', '.join(failed))}[/]" if failed else "all hosts ok")
    )


def plan(
    inventory: Path = InventoryArg,
    only: str = OnlyOpt,
    skip: str = SkipOpt,
    limit: str = LimitOpt,
    as_json: bool = JsonOpt,
    progress_mode: ProgressChoice = ProgressOpt,
) -> None:
    """Show what `up` would change on every host, step by step: packages, files (with
    diffs) and services. Runs preflight and change detection only; changes nothing.

    Each step is planned against the hosts as they are now, so a step after one that
    would install something may list more than `up` will do.

    Exit code: 0 every host can proceed, 1 preflight would stop a host, 2 bad input.

    Example: provision plan inventories/testbed.py --only base
    """
    cluster = host_limit.apply(inventory_lib.load(inventory), limit)
    steps = pipeline.select(only, skip)
    pipeline.check_inputs(cluster, steps)
    with host_progress([n.name for n in cluster.nodes], enabled=not as_json, mode=progress_mode.value) as progress:
        plans = pipeline.plan(cluster, steps, on_event=progress)
    if as_json:
        print_json(
            {"schema": "provision.plan/1", "hosts": [asdict(p) | {"changes": p.changes} for p in plans.values()]}
        )
    else:
        for host_plan in plans.values():
            print_plan(host_plan)
    raise typer.Exit(EXIT_FAILED if any(p.refused for p in plans.values()) else EXIT_OK)


def print_plan(p: HostPlan) -> None:
    out.rule(f"[bold]{safe(p.name)}[/]: {p.changes} changes" + (" [red](would stop)[/]" if p.refused else ""))
    for reason in p.refused:
        out.print(f"[red]would stop: {safe(reason)}[/]", soft_wrap=True)
    for step, ops in p.steps.items():
        out.print(f"[bold]{step}[/]: " + (f"{len(ops)} operations would change" if ops else "no changes"))
        for op in ops:
            out.print(f"  [cyan]{safe(op.name)}[/]")
            for command in op.commands:
                out.print(f"    $ {plain(command)}", soft_wrap=True, markup=False)
            for diff in op.diffs:
                out.print("      " + plain(diff).replace("\n", "\n      "), markup=False, soft_wrap=True)
    for text in p.notes:
        out.print(f"[dim]{safe(text)}[/]", soft_wrap=True)


def verify(
    inventory: Path = InventoryArg,
    workdir: Path = typer.Option(None, "--workdir", help="where the ssh_config, spec and JUnit XML go"),
    limit: str = LimitOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Check from the outside that every host has what `up` promises (packages and
    versions, holds, services, files, mounts), with the pytest-testinfra suite shipped
    in provision/verify. Each host by its own pytest process, side by side, each within 30
    minutes (a host that hangs is reported, the others keep their results). Writes JUnit XML
    for CI.

    Exit code: 0 all checks passed, 1 some failed or a host could not be checked, 2 bad input.

    Example: provision verify inventories/testbed.py
    """
    from provision import verify as verify_lib

    problem = verify_lib.workdir_problem(workdir) if workdir else None
    if problem:
        raise InputError(Problem("--workdir", problem, "name a new or empty directory"))
    cluster = host_limit.apply(inventory_lib.load(inventory), limit)
    err.print(f"verifying {len(cluster.nodes)} hosts with pytest-testinfra ...")
    result = verify_lib.run(cluster, str(workdir) if workdir else None)
    if as_json:
        print_json(
            {
                "schema": "provision.verify/1",
                "ok": result.exit_code == 0,
                "junit_xml": result.junit_xml,
                "output": result.output,
            }
        )
    else:
        out.print(result.output, markup=False, soft_wrap=True)
        out.print(f"JUnit XML: {result.junit_xml}")
    raise typer.Exit(EXIT_OK if result.exit_code == 0 else EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("plan")(plan)
    app.command("verify")(verify)
