"""`provision backup run|list|restore|check`: back up now, list snapshots, restore, check
the repositories (over SSH).

Exit codes: 0 every host did it, 1 a host failed, 2 bad input (unknown host, a host that
has no backups, a --read-data-subset restic would refuse), nothing touched. The restic
password never appears: hosts read it from their own 0600 file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import typer
from rich.table import Table

from provision import inventory as inventory_lib
from provision.backup import runs as backup
from provision.cli.console import err, host_progress, out, print_json, safe
from provision.cli.options import InventoryArg, JsonOpt
from provision.errors import EXIT_FAILED, InputError, Problem
from provision.inventory import Cluster, Node
from provision.remote import on_all
from provision.rules import backups as backup_layout

app = typer.Typer(help="Back up, list and restore training data (restic).", no_args_is_help=True)


def _hosts(cluster: Cluster, host: str | None) -> list[Node]:
    """The hosts a command acts on: --host, else every host that backs up."""
    if host is not None:
        try:
            node = cluster.node(host)
        except KeyError:
            raise InputError(
                Problem(
                    f"--host {host}",
                    "not a host of this inventory",
                    f"hosts: {', '.join(n.name for n in cluster.nodes)}",
                )
            ) from None
        reason = backup_layout.skip_reason(node, cluster)
        if reason:
            raise InputError(Problem(f"--host {host}", "this host has no backups", reason))
        return [node]
    nodes = [n for n in cluster.nodes if backup_layout.skip_reason(n, cluster) is None]
    if not nodes:
        raise InputError(
            Problem(str(cluster.path), "no host backs up", "put a host in the 'storage' group, or set backup_paths")
        )
    return nodes


def _finish(outcomes: dict[str, backup.Outcome], as_json: bool, title: str, passed: str = "ok") -> None:
    if as_json:
        print_json(
            {
                "schema": "provision.backup.runs/1",
                "ok": all(o.ok for o in outcomes.values()),
                "hosts": [asdict(o) for o in outcomes.values()],
            }
        )
    else:
        table = Table(title=title)
        for column in ("host", "result", "seconds", "detail"):
            table.add_column(column)
        for o in outcomes.values():
            table.add_row(safe(o.host), passed if o.ok else "[red]FAILED[/]", f"{o.seconds:.1f}", safe(o.detail))
        out.print(table)
    if not all(o.ok for o in outcomes.values()):
        raise typer.Exit(EXIT_FAILED)


def _each(
    nodes: list[Node], what: str, func: Callable[[Node], backup.Outcome], as_json: bool
) -> dict[str, backup.Outcome]:
    with host_progress([n.name for n in nodes], enabled=not as_json) as progress:

        def one(node: Node) -> backup.Outcome:
            progress(node.name, what)
            outcome = func(node)
            progress(node.name, "done" if outcome.ok else "FAILED")
            return outcome

        return on_all(nodes, one)


@app.command("run")
def run(
    inventory: Path = InventoryArg,
    host: str | None = typer.Option(None, "--host", help="only this host (default: every host that backs up)"),
    as_json: bool = JsonOpt,
) -> None:
    """Back up now: start each host's backup unit (the one the timer starts) and wait.

    Example: provision backup run inventories/testbed.py --host node1
    """
    cluster = inventory_lib.load(inventory)
    nodes = _hosts(cluster, host)
    _finish(_each(nodes, "backing up", backup.run_now, as_json), as_json, "backup run")


@app.command("list")
def list_(
    inventory: Path = InventoryArg,
    host: str | None = typer.Option(None, "--host", help="only this host"),
    as_json: bool = JsonOpt,
) -> None:
    """List each host's snapshots (id, time, paths).

    Example: provision backup list inventories/testbed.py --json
    """
    cluster = inventory_lib.load(inventory)
    outcomes = _each(_hosts(cluster, host), "listing", backup.list_snapshots, as_json)
    if not as_json:
        for o in outcomes.values():
            for s in o.data.get("snapshots", []):
                out.print(safe(f"{o.host}  {s['short_id']}  {s['time'][:19]}  {' '.join(s['paths'])}"))
    _finish(outcomes, as_json, "snapshots")


@app.command("restore")
def restore(
    inventory: Path = InventoryArg,
    host: str | None = typer.Option(
        None,
        "--host",
        help="the host whose backup to restore (default: the only host that backs up; with --check, every one)",
    ),
    snapshot: str = typer.Option("latest", "--snapshot", help="snapshot id, or 'latest'"),
    target: str | None = typer.Option(
        None,
        "--target",
        help="directory on the host to restore into; must be new or empty (default: <data_mount>/restores/<time>)",
    ),
    in_place: bool = typer.Option(False, "--in-place", help="restore over the live files (overwrites them)"),
    check: bool = typer.Option(
        False,
        "--check",
        help="restore to a scratch directory, compare every "
        "file's sha256 with the live file, then remove the scratch copy",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Restore a snapshot on its host: into a separate directory by default, never over live
    data unless --in-place is given. With --check and no --host, every host that backs up
    checks its latest snapshot against its live files.

    Example: provision backup restore inventories/testbed.py --host node1 --snapshot latest
    """
    if sum([in_place, check, target is not None]) > 1:
        raise InputError(Problem("restore", "--target, --in-place and --check exclude each other", "choose one"))
    flag_problems = backup.restore_flag_problems(snapshot, target)
    if flag_problems:
        raise InputError(flag_problems)
    cluster = inventory_lib.load(inventory)
    nodes = _hosts(cluster, host)
    # --check only reads live data and removes its scratch copy, so it checks every host
    # that backs up; a restore writes, so it acts on one host named outright.
    if host is None and len(nodes) > 1 and not check:
        raise InputError(Problem("restore", f"{len(nodes)} hosts back up", "name one with --host"))
    if len(nodes) > 1 and snapshot != "latest":
        raise InputError(
            Problem("--snapshot", f"{len(nodes)} hosts back up and a snapshot is one host's", "name it with --host")
        )
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    if in_place and not as_json:
        err.print(safe(f"restoring {snapshot} over the live files on {nodes[0].name}"))

    def one(node: Node) -> backup.Outcome:
        if check:
            return backup.check(node, snapshot, stamp)
        return backup.restore(node, snapshot, target, in_place, stamp)

    _finish(_each(nodes, "restoring", one, as_json), as_json, "backup restore")


@app.command("check")
def check_repositories(
    inventory: Path = InventoryArg,
    host: str | None = typer.Option(None, "--host", help="only this host's repository"),
    read_data_subset: str | None = typer.Option(
        None,
        "--read-data-subset",
        help="also read back and verify this share of the data: "
        "a percentage such as 10%, or part n/t such as 1/5 (check a different part each run)",
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Check each backing-up host's restic repository for errors (restic check, run on the
    host with its own password file). A repository that hosts share is checked once.

    Exit 0 when every check passed, 1 when one failed or a host could not be reached, 2
    for bad input.

    Example: provision backup check inventories/testbed.py --read-data-subset 10%
    """
    subset = backup.read_data_subset(read_data_subset) if read_data_subset is not None else None
    cluster = inventory_lib.load(inventory)
    nodes = _hosts(cluster, host)
    checkers = backup.repository_checkers(nodes, cluster)
    checked = _each(
        [n for n in nodes if checkers[n.name] == n.name],
        "checking",
        lambda node: backup.check_repository(node, subset),
        as_json,
    )
    _finish(backup.shared_outcomes(checkers, checked), as_json, "backup check", passed="passed")
