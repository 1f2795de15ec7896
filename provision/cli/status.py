"""`provision status`: the fleet at a glance, with drift from the pinned settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision.cli.console import host_progress, out, print_json, safe
from provision.cli.options import InventoryArg
from provision.errors import EXIT_FAILED


def status(
    inventory: Path = InventoryArg,
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON on stdout"),
) -> None:
    """Show every host: reachable, OS and kernel, installed driver / CUDA / fabric manager /
    torch / NCCL versions, reboot pending, data volume and NFS mounts, last backup, last
    validate verdict. Anything that differs from the pinned settings is DRIFT, shown with
    the expected and the actual value. Changes nothing.

    Exit code 0 when every host is reachable and nothing drifted, 1 otherwise.

    Example: provision status inventories/testbed.py --json
    """
    from provision.status import judge as status_lib
    from provision.status.gather import gather_status

    cluster = inventory_lib.load(inventory)
    with host_progress([n.name for n in cluster.nodes], enabled=not as_json) as progress:
        statuses = gather_status(cluster, on_event=progress)
    if as_json:
        print_json(status_lib.as_json(statuses))
    else:
        _print(statuses)
    if not status_lib.as_json(statuses)["ok"]:
        raise typer.Exit(EXIT_FAILED)


def _print(statuses: list[Any]) -> None:
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
    ):
        table.add_column(column)
    for s in statuses:
        if not s.reachable:
            table.add_row(safe(s.name), f"[red]unreachable: {safe(s.error)}[/]", *[""] * 6)
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
        )
    out.print(table)
    drifted = [(s.name, d) for s in statuses for d in s.drift]
    if drifted:
        drift = Table(title="[red]drift from the pinned settings[/]")
        for column in ("host", "item", "expected", "actual"):
            drift.add_column(column)
        for name, d in drifted:
            drift.add_row(safe(name), safe(d.item), safe(d.expected), safe(d.actual))
        out.print(drift)
    else:
        out.print("[green]no drift[/]: every host matches its pinned settings")
