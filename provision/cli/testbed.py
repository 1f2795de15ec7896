"""`provision testbed ...`: a local cluster of real qemu VMs (Debian 12) to try provision on.

Thin: the work is in provision.testbed (Testbed); this module parses options, shows
progress on stderr and prints tables or JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from provision.cli.console import err, log_line, out, print_json

if TYPE_CHECKING:
    from provision.testbed import Testbed
    from provision.testbed.state import NodeRecord

app = typer.Typer(
    help="A local cluster of qemu VMs (Debian 12) for trying provision: up, status, ssh, down.",
    no_args_is_help=True,
)

StateDirOpt = typer.Option(None, "--state-dir", help="testbed state dir (default: ~/.cache/provision/testbed)")


@contextmanager
def _progress(enabled: bool = True) -> Iterator[Callable[[str, str], None]]:
    """A live line per subject (image, accel, node1, ...), added as they first report; off
    a terminal (CI, nohup, the demo's pipe) one timestamped log line per report instead, as
    `up` does: rich draws nothing there, and an image build is minutes of silence."""
    lines = enabled and not err.is_terminal
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description:<8}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        disable=not enabled or lines,
    )
    tasks: dict[str, TaskID] = {}

    def report(subject: str, text: str) -> None:
        if lines:
            log_line(subject, text)
            return
        if subject not in tasks:
            tasks[subject] = progress.add_task(subject, status=text, total=None)
        progress.update(tasks[subject], status=text)

    with progress:
        yield report


# What a testbed keeps in its state directory (provision/testbed: lifecycle, state, node),
# and write_atomic's temp files. `down` deletes these names and `up` writes known_hosts and
# keys/ there: a --state-dir holding anything else (~/.ssh, a project) is not a testbed's.
TESTBED_NAMES = {"nodes", "switch", "keys", "known_hosts", "probe", "state.json", ".lock"}


def _testbed(state_dir: Path | None, inventory: Path | None = None, mirror: str | None = None) -> Testbed:
    """The library handle. Made before any progress display starts: importing the
    testbed imports pyinfra's CLI package, which must patch threading (gevent) before
    rich's refresh thread or paramiko's threads exist."""
    from provision.testbed import Testbed

    tb = Testbed(state_dir, inventory_path=inventory, mirror=mirror)
    if state_dir is not None:
        _check_state_dir(tb.state_dir)
    return tb


def _check_state_dir(path: Path) -> None:
    from provision.errors import InputError, Problem, names_label

    if path.exists() and not path.is_dir():
        raise InputError(
            Problem(f"--state-dir {path}", "is not a directory", "name a testbed's directory, or a new one")
        )
    foreign = sorted(
        p.name
        for p in (path.iterdir() if path.is_dir() else [])
        if p.name not in TESTBED_NAMES and not p.name.endswith(".tmp")
    )
    if foreign:
        shown = names_label(foreign, shown=5)
        raise InputError(
            Problem(
                f"--state-dir {path}",
                f"holds files a testbed never makes ({shown}): not a testbed's directory, so nothing in it is touched",
                "name the directory `provision testbed up` made, or a new one",
            )
        )


@app.command("up")
def up(
    nodes: int = typer.Option(2, "--nodes", "-n", help="number of VMs (node1..nodeN)"),
    disks: int = typer.Option(2, "--disks", "-d", help="extra virtio data disks per VM"),
    memory: int = typer.Option(2048, "--memory", "-m", help="RAM per VM in MiB"),
    cpus: int = typer.Option(2, "--cpus", help="vCPUs per VM"),
    accel: str = typer.Option("auto", "--accel", help="auto (KVM only if a probe VM really boots), kvm or tcg"),
    disk_gb: int = typer.Option(2, "--disk-gb", help="size of each data disk in GiB (sparse)"),
    inventory: Path = typer.Option(
        None,
        "--inventory",
        help="where to write the pyinfra inventory (default: inventories/testbed.py, or where `up` wrote it before)",
    ),
    mirror: str = typer.Option(
        None, "--mirror", help="Debian mirror URL; default: the one in this machine's apt sources"
    ),
    state_dir: Path = StateDirOpt,
    as_json: bool = typer.Option(False, "--json", help="print the nodes as JSON on stdout"),
) -> None:
    """Bring up NODES qemu VMs and write a pyinfra inventory for them.

    The Debian 12 image is built once with debootstrap and cached under
    ~/.cache/provision/images. Each VM gets its own SSH host key (pinned in the
    inventory's known_hosts), data disks at /dev/disk/by-id/virtio-NVME-<node>-<k>,
    SSH on a loopback port and an address on the private cluster network 10.77.0.0/24.
    Running again leaves running VMs as they are and starts stopped ones.

    Example: provision testbed up --nodes 2 --disks 2
    """
    from provision import inventory as inventory_lib

    tb = _testbed(state_dir, inventory, mirror=mirror)  # imports first: see _testbed
    from provision.testbed.lifecycle import check_up_args

    check_up_args(nodes, disks, memory, cpus, disk_gb, accel, mirror)  # bad input: one line each, no progress
    with _progress(enabled=True) as report:
        tb.progress = report
        records = tb.up(nodes=nodes, disks=disks, memory_mb=memory, cpus=cpus, accel=accel, disk_gb=disk_gb)
    inventory_lib.load(tb.inventory_path)  # the inventory we hand over must pass `inventory check`
    if as_json:
        print_json(_status_json(tb, records))
        return
    _print_table(tb, records)
    err.print(f"inventory: {tb.inventory_path} (checked). Next: provision up {_rel(tb.inventory_path)}")


@app.command("status")
def status(
    state_dir: Path = StateDirOpt,
    as_json: bool = typer.Option(False, "--json", help="print the nodes as JSON on stdout"),
) -> None:
    """Show each node: running or stopped, qemu pid, SSH port, cluster address, disks.

    Example: provision testbed status --json
    """
    tb = _testbed(state_dir)
    records = tb.status()
    if as_json:
        print_json(_status_json(tb, records))
        return
    if not records:
        out.print(f"no testbed in {tb.state_dir}; start one with `provision testbed up`")
        return
    _print_table(tb, records)


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    node: str = typer.Argument(..., help="node name, e.g. node1"),
    command: list[str] = typer.Argument(None, help="command to run instead of a shell (after --)"),
    state_dir: Path = StateDirOpt,
) -> None:
    """Open a root shell on NODE (or run a command), with the pinned host key.

    Example: provision testbed ssh node1 -- lsblk
    """
    argv = _testbed(state_dir).ssh_argv(node, list(command or []))
    os.execvp(argv[0], argv)


@app.command("down")
def down(state_dir: Path = StateDirOpt) -> None:
    """Stop the testbed's VMs and switch (by recorded pid) and delete their disks, sockets,
    keys, state and inventory. The cached base image stays.

    Example: provision testbed down
    """
    tb = _testbed(state_dir)
    with _progress() as report:
        tb.progress = report
        stopped = tb.down()
    out.print(
        f"testbed down: stopped {len(stopped)} processes ({', '.join(map(str, stopped)) or 'none running'}); "
        f"removed {tb.state_dir}"
    )


def _status_json(tb: Testbed, records: list[NodeRecord]) -> dict[str, Any]:
    return {
        "state_dir": str(tb.state_dir),
        "inventory": str(tb.inventory_path),
        "switch_running": tb.switch_running(),
        "nodes": [
            {
                **asdict(r),
                "state": "running" if r.running else "stopped",
                "ssh": f"127.0.0.1:{r.ssh_port}",
                "data_disks": r.data_disks,
            }
            for r in records
        ],
    }


def _print_table(tb: Testbed, records: list[NodeRecord]) -> None:
    table = Table(title=f"testbed {tb.state_dir}")
    for column in ("node", "state", "pid", "ssh", "cluster address", "data disks"):
        table.add_column(column)
    for r in records:
        state = "[green]running[/]" if r.running else "[red]stopped[/]"
        table.add_row(
            r.name,
            state,
            str(r.pid or "-"),
            f"127.0.0.1:{r.ssh_port}",
            r.cluster_address,
            "\n".join(r.data_disks) or "-",
        )
    out.print(table)


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
