"""`provision facts`: the first real pyinfra run -- what each host is made of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision import limit as host_limit
from provision.cli.console import host_progress, out, print_json, safe
from provision.cli.options import InventoryArg, LimitOpt
from provision.errors import EXIT_FAILED
from provision.facts.host import HOST_FACTS, summarize
from provision.facts.host import as_json as host_json


def facts(
    inventory: Path = InventoryArg,
    as_json: bool = typer.Option(False, "--json", help="print the facts as JSON on stdout"),
    limit: str = LimitOpt,
) -> None:
    """Gather OS, kernel, CPU, RAM, disks (stable ids, whether they hold data), NICs and
    NVIDIA GPUs from every host. Changes nothing.

    Exit code 1 when a host could not be reached (the others are still reported).

    Example: provision facts inventories/testbed.py --json --limit node1
    """
    from provision.engine import gather_facts

    cluster = host_limit.apply(inventory_lib.load(inventory), limit)
    with host_progress([n.name for n in cluster.nodes], enabled=not as_json) as progress:
        result = gather_facts(list(cluster.nodes), HOST_FACTS, on_event=progress)
    hosts = [summarize(n.name, result.facts.get(n.name), result.failed.get(n.name)) for n in cluster.nodes]
    if as_json:
        print_json({"schema": "provision.facts/1", "hosts": [host_json(h) for h in hosts]})
    else:
        _print_tables(hosts)
    if result.failed:
        raise typer.Exit(EXIT_FAILED)


def _print_tables(hosts: list[Any]) -> None:
    table = Table(title="hosts")
    for column in ("host", "os / kernel", "cpu", "ram", "nics (Mbit/s)", "gpus"):
        table.add_column(column)
    for h in hosts:
        if not h.reachable:
            table.add_row(safe(h.name), f"[red]no facts: {safe(h.error)}[/]", "", "", "", "")
            continue
        nics = "\n".join(f"{n['name']} {','.join(n['addresses']) or '-'} {n['speed_mbps'] or '?'}" for n in h.nics)
        gpus = "\n".join(f"{g['description']} [{g['device_id']}]" for g in h.gpus) or "none"
        table.add_row(
            safe(h.name),
            safe(f"{h.os['pretty_name']}\n{h.kernel}"),
            safe(f"{h.cpu['model']}\n{h.cpu['sockets']}s/{h.cpu['cores']}c/{h.cpu['threads']}t"),
            f"{h.memory_bytes / 2**30:.1f} GiB",
            safe(nics),
            safe(gpus),
        )
    out.print(table)
    disks = Table(title="block devices")
    for column in ("host", "device", "stable ids", "size", "holds"):
        disks.add_column(column)
    for h in hosts:
        for d in h.block_devices:
            holds = "root disk" if d["is_root"] else (safe(d["holds"]) if d["holds"] else "[green]blank[/]")
            ids = safe("\n".join(d["by_id"]) or "-")
            disks.add_row(safe(h.name), safe(d["path"]), ids, f"{d['size_bytes'] / 2**30:.1f} GiB", holds)
    out.print(disks)
