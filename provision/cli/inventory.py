"""`provision inventory ...`: load and check an inventory without touching any host."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision.cli.console import out, print_json, safe
from provision.cli.options import InventoryArg
from provision.settings import ROLES, knob_docs
from provision.up import pipeline

app = typer.Typer(help="Check inventories. Nothing here contacts a host.", no_args_is_help=True)


@app.command("check")
def check(
    inventory: Path = InventoryArg,
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON on stdout"),
) -> None:
    """Load and validate INVENTORY; print hosts, groups, roles and each host's settings.

    Every problem is printed on its own line (file, host, key) and the exit code is 2.
    No host is contacted.

    Example: provision inventory check inventories/example.py
    """
    cluster = inventory_lib.load(inventory)
    pipeline.check_inputs(cluster)  # what `up` and `plan` would refuse before any host
    head, why = cluster.head_node()
    if as_json:
        print_json(
            {
                "inventory": str(cluster.path),
                "slurm": {
                    "head": head.name,
                    "head_because": why,
                    "compute": [n.name for n in cluster.compute_nodes()],
                },
                "hosts": [
                    {
                        "name": n.name,
                        "ssh": asdict(n.ssh),
                        "cluster_address": n.cluster_address,
                        "groups": list(n.groups),
                        "roles": [g for g in n.groups if g in ROLES],
                        "settings": asdict(n.settings),
                    }
                    for n in cluster.nodes
                ],
            }
        )
        return
    table = Table(title=f"{cluster.path}: {len(cluster.nodes)} hosts")
    for column in ("host", "ssh", "cluster address", "groups", "roles"):
        table.add_column(column)
    for n in cluster.nodes:
        table.add_row(
            safe(n.name),
            safe(f"{n.ssh.user or ''}{'@' if n.ssh.user else ''}{n.ssh.hostname}:{n.ssh.port}"),
            safe(n.cluster_address),
            safe(", ".join(n.groups)),
            ", ".join(g for g in n.groups if g in ROLES) or "-",
        )
    out.print(table)
    compute = ", ".join(n.name for n in cluster.compute_nodes())
    out.print(f"Slurm controller: [bold]{safe(head.name)}[/] ({why}); compute nodes: {safe(compute)}")
    for n in cluster.nodes:
        changed = {k: v for k, v in asdict(n.settings).items() if v != _defaults()[k]}
        out.print(
            f"[bold]{safe(n.name)}[/] settings (non-default): "
            + safe(", ".join(f"{k}={v!r}" for k, v in changed.items()) or "all defaults")
        )


@app.command("knobs")
def knobs() -> None:
    """List every setting a host or group may set: name, default and what it controls.

    Example: provision inventory knobs
    """
    table = Table(title="settings (host or group data keys)")
    for column in ("key", "default", "what it controls"):
        table.add_column(column)
    for name, default, doc in knob_docs():
        table.add_row(name, safe(repr(default)), safe(doc))
    out.print(table)
    roles = Table(title="roles (group names)")
    roles.add_column("group")
    roles.add_column("meaning")
    for group, meaning in ROLES.items():
        roles.add_row(group, meaning)
    out.print(roles)


def _defaults() -> dict[str, object]:
    return {name: default for name, default, _ in knob_docs()}
