"""`provision status`: the fleet at a glance, with drift from the pinned settings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision.cli.console import host_progress, out, print_json, safe
from provision.cli.options import InventoryArg, LimitOpt
from provision.errors import EXIT_FAILED

if TYPE_CHECKING:
    from provision.scheduler import SlurmView
    from provision.status.judge import Drift, HostStatus
    from provision.status.summary import FleetSummary, Shared


def status(
    inventory: Path = InventoryArg,
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON on stdout"),
    every: bool = typer.Option(False, "--all", help="print every host's row, however large the fleet"),
    limit: str = LimitOpt,
) -> None:
    """Show the fleet: a summary first (hosts reachable, drifted, reboot pending, mounts
    not ok; the OS, kernel, driver / CUDA / fabric manager / torch / NCCL / numpy versions
    seen, with how many hosts have each), then the exceptions, each once with the hosts that
    have it: unreachable (and why), drift (item, expected and actual value against the
    pinned settings), reboot pending, mounts not ok. Up to 20 hosts, or with --all, every
    host's row instead: OS and kernel, versions, reboot, mounts, last backup, last validate
    verdict, Slurm state, then each host's drift. Where Slurm runs, last: its node states
    counted, every node not idle, allocated or mixed with its reason (drained, down), and the
    queue. Changes nothing on the hosts but its own figures for Prometheus (each host's
    drift count, in the monitoring step's textfile directory).

    Exit code 0 when every host is reachable and nothing drifted, 1 otherwise.

    Example: provision status inventories/testbed.py --json
    """
    from provision.status import summary as summary_lib
    from provision.status.gather import gather_slurm, gather_status

    cluster = host_limit.apply(inventory_lib.load(inventory), limit)
    with host_progress([n.name for n in cluster.nodes], enabled=not as_json) as progress:
        statuses = gather_status(cluster, on_event=progress)
    slurm = gather_slurm(cluster, statuses)
    _publish(cluster, statuses)
    report = summary_lib.as_json(statuses, slurm)
    if as_json:
        print_json(report)
    else:
        print_status(statuses, every)
        if slurm is not None:
            print_slurm(slurm)
    if not report["ok"]:
        raise typer.Exit(EXIT_FAILED)


def _publish(cluster: Any, statuses: list[HostStatus]) -> None:
    """Each reachable host's drift count for Prometheus; a host that could not take it is
    named on stderr and changes nothing else."""
    import time

    from provision.cli.console import err
    from provision.status import textfile

    for host, why in textfile.publish(cluster, statuses, time.time()).items():
        err.print(f"[yellow]monitoring:[/] {safe(host)}: the drift count was not written for Prometheus: {safe(why)}")


def print_status(statuses: list[HostStatus], every: bool) -> None:
    from provision.status import summary as summary_lib

    summary = summary_lib.summarize(statuses)
    _print_summary(summary)
    if summary_lib.lists_every_host(len(statuses), every):
        _print_hosts(statuses)
        _print_drift([(s.name, d) for s in statuses for d in s.drift], summary)
        return
    found = summary_lib.exceptions(statuses)
    _print_shared("[red]unreachable[/]", ("why",), found.unreachable)
    _print_shared("[red]drift from the pinned settings[/]", ("item", "expected", "actual"), found.drift)
    if not summary.drifted:
        _print_no_drift(summary)
    if found.reboot_pending:
        out.print(f"[yellow]reboot pending[/]: {safe(summary_lib.host_ranges(found.reboot_pending))}")
    _print_shared("[red]mounts not ok[/]", ("mount", "state"), found.mounts)
    if summary.healthy:
        out.print(f"{summary.healthy} healthy hosts not listed one by one (--all lists every host)")


SHOWN_JOBS = 10  # jobs the queue table lists; the line above it counts them all


def print_slurm(slurm: SlurmView) -> None:
    from provision.status.summary import slurm_exceptions, slurm_line

    line = safe(slurm_line(slurm))
    out.print(f"[red]{line}[/]" if slurm.error else line)
    _print_shared("[yellow]slurm nodes not working[/]", ("state", "reason"), slurm_exceptions(slurm))
    if slurm.jobs:
        rows = [(j.id, j.state, j.user, str(j.nodes), j.elapsed, j.name) for j in slurm.jobs[:SHOWN_JOBS]]
        title = "slurm queue" + (f" (first {SHOWN_JOBS} of {len(slurm.jobs)})" if len(slurm.jobs) > SHOWN_JOBS else "")
        _print_rows(title, ("job", "state", "user", "nodes", "time", "name"), rows)


def _print_shared(title: str, columns: tuple[str, ...], shared: list[Shared]) -> None:
    """One row per exception, with how many hosts have it and their names."""
    from provision.status.summary import host_ranges

    if shared:
        rows = [(*s.key, str(len(s.hosts)), host_ranges(s.hosts)) for s in shared]
        _print_rows(title, (*columns, "hosts", "names"), rows)


def _print_summary(summary: FleetSummary) -> None:
    from provision.status.summary import seen_text

    def count(n: int, what: str, colour: str) -> str:
        return f"[{colour}]{n} {what}[/]" if n else f"{n} {what}"

    out.print(
        f"[bold]fleet[/]: {summary.hosts} hosts, {summary.reachable} reachable, "
        + ", ".join(
            (
                count(summary.unreachable, "unreachable", "red"),
                count(summary.drifted, "drifted", "red"),
                count(summary.reboot_pending, "reboot pending", "yellow"),
                count(summary.mounts_not_ok, "mounts not ok", "red"),
            )
        )
    )
    seen = Table(title="seen across the reachable hosts", box=None, title_justify="left")
    seen.add_column("item")
    seen.add_column("value x hosts")
    for item, values in summary.seen.items():
        seen.add_row(item, safe(seen_text(values)))
    out.print(seen)


def _print_rows(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(safe(cell) for cell in row))
    out.print(table)


def _print_drift(drifted: list[tuple[str, Drift]], summary: Any) -> None:
    if drifted:
        rows = [(name, d.item, d.expected, d.actual) for name, d in drifted]
        _print_rows("[red]drift from the pinned settings[/]", ("host", "item", "expected", "actual"), rows)
    elif not summary.drifted:
        _print_no_drift(summary)


def _print_no_drift(summary: Any) -> None:
    """No drift among the hosts that answered; a host that did not is unknown, not clean."""
    if not summary.reachable:
        out.print("[red]no host answered[/]: drift unknown")
    elif summary.unreachable:
        out.print(
            f"[green]no drift[/] on the {summary.reachable} reachable hosts; "
            f"[red]{summary.unreachable} unreachable[/], unknown"
        )
    else:
        out.print("[green]no drift[/]: every host matches its pinned settings")


def _print_hosts(statuses: list[HostStatus]) -> None:
    table = Table(title="fleet status")
    for column in (
        "host",
        "os / kernel",
        "driver / cuda / fm",
        "torch / nccl",
        "reboot",
        "mounts",
        "last backup",
        "last validate",
        "slurm",
    ):
        table.add_column(column)
    for s in statuses:
        if not s.reachable:
            table.add_row(safe(s.name), f"[red]unreachable: {safe(s.error)}[/]", *[""] * 7)
            continue
        v = s.versions
        mounts = (
            "\n".join(
                f"{safe(p)} {'[green]ok[/]' if st == 'ok' else f'[red]{safe(st)}[/]'}" for p, st in s.mounts.items()
            )
            or "-"
        )
        table.add_row(
            safe(s.name),
            safe(f"{s.os}\n{s.kernel}"),
            safe(f"{v.get('driver') or '-'} / {v.get('cuda') or '-'} / {v.get('fabricmanager') or '-'}"),
            safe(f"{v.get('torch') or '-'} / {v.get('nccl') or '-'}"),
            "[yellow]yes[/]" if s.reboot_pending else "no",
            mounts,
            safe(s.last_backup),
            safe(s.last_validate or "-"),
            safe(s.slurm or "-"),
        )
    out.print(table)
