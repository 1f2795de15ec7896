"""`provision monitor`: the fleet live, from Prometheus on the head."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from provision import inventory as inventory_lib
from provision import remote
from provision.cli.console import err, out, print_json, safe
from provision.cli.options import InventoryArg
from provision.errors import EXIT_FAILED
from provision.rules import monitoring as layout

if TYPE_CHECKING:
    from provision.inventory import Cluster
    from provision.launch.session import StopRequest
    from provision.monitoring.fleet import FleetView, Prometheus


def monitor(
    inventory: Path = InventoryArg,
    once: bool = typer.Option(False, "--once", help="read the fleet once and exit"),
    as_json: bool = typer.Option(False, "--json", help="print the view as JSON on stdout (with --once: one object)"),
    interval: float = typer.Option(5.0, "--interval", min=1.0, max=3600.0, help="seconds between reads"),
) -> None:
    """Watch the fleet live from Prometheus on the head (set up by the monitoring step of
    `provision up`), through an SSH channel to the head: per node, up or down, CPU,
    memory and fullest-disk use, network rates, each GPU's utilisation, memory,
    temperature and power, the Slurm state and the alerts firing; then the running
    training job's step, loss and tokens/s. Refreshes every --interval seconds until
    Ctrl-C; off a terminal, one block of lines per read. Changes nothing.

    Exit code 0; 1 when monitoring is not provisioned or Prometheus does not answer (the
    head named), or with --once when a node is down or an alert fires.

    Example: provision monitor inventories/testbed.py --once --json
    """
    from provision.monitoring import fleet

    whole = inventory_lib.load(inventory)
    # hosts with monitoring = false have no exporter: not shown, and not called down
    cluster = whole.part(layout.monitored(whole))
    try:
        head = fleet.head_of(whole)
        prometheus = fleet.Prometheus(head)
    except fleet.MonitorError as e:
        _fail(str(e))
    try:
        if once:
            view = _read(cluster, prometheus)
            if as_json:
                print_json(view.as_json())
            else:
                out.print(render(view))
            if view.alerts or any(n.up is not True for n in view.nodes):
                raise typer.Exit(EXIT_FAILED)
            return
        _watch(cluster, prometheus, interval, as_json)
    finally:
        prometheus.close()


def _read(cluster: Cluster, prometheus: Prometheus) -> FleetView:
    from provision.monitoring import fleet

    try:
        return fleet.read(cluster, prometheus)
    except remote.RemoteError as e:
        _fail(
            f"Prometheus does not answer on {e}; has `provision up` run its monitoring step on {prometheus.head.name}?"
        )
    except fleet.MonitorError as e:
        _fail(str(e))


def _fail(message: str) -> NoReturn:
    err.print(f"[red]monitor[/]: {safe(message)}", soft_wrap=True)  # one line, whatever the width
    raise typer.Exit(EXIT_FAILED)


def _watch(cluster: Cluster, prometheus: Prometheus, interval: float, as_json: bool) -> None:
    """Read and show every ``interval`` seconds until Ctrl-C or SIGTERM. The signals only
    set a flag, checked between reads and every 0.2 s of the wait: the SSH threads are
    gevent greenlets here, and a KeyboardInterrupt raised in one of them would be dropped
    by gevent's hub, leaving the monitor running (launch.session.stop_signals)."""
    from provision.launch.session import stop_signals

    live = sys.stdout.isatty() and not as_json
    with stop_signals() as stop:
        if live:
            with Live(render(_read(cluster, prometheus)), console=out, auto_refresh=False) as screen:
                while _wait(stop, interval):
                    screen.update(render(_read(cluster, prometheus)), refresh=True)
            return
        while stop.why is None:  # off a terminal: one block per read, so a log shows every one
            view = _read(cluster, prometheus)
            if as_json:
                print_json(view.as_json())
            else:
                out.print(render(view))
            sys.stdout.flush()
            _wait(stop, interval)


def _wait(stop: StopRequest, seconds: float) -> bool:
    """Sleep ``seconds`` unless a stop is asked for; whether to go on."""
    deadline = time.monotonic() + seconds
    while stop.why is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return stop.why is None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def _num(value: float | None, unit: str, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def render(view: FleetView) -> Group:
    """The view as tables: nodes, then GPUs, training and alerts where there are any."""
    parts = [_nodes_table(view)]
    parts += [t for t in (_gpus_table(view), _training_table(view), _alerts_table(view)) if t is not None]
    return Group(*parts)


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    return table


def _nodes_table(view: FleetView) -> Table:
    when = time.strftime("%H:%M:%S", time.localtime(view.at))
    table = _table(
        f"fleet from Prometheus on {safe(view.head)} at {when}",
        ("node", "state", "cpu", "memory", "disk", "net in", "net out", "slurm", "alerts"),
    )
    for n in view.nodes:
        state = "[green]up[/]" if n.up else ("[red]down[/]" if n.up is False else "[yellow]not scraped[/]")
        alerts = f"[red]{safe(', '.join(n.alerts))}[/]" if n.alerts else "-"
        table.add_row(
            safe(n.name), state, _pct(n.cpu), _pct(n.memory), _pct(n.disk), _rate(n.net_rx), _rate(n.net_tx),
            safe(n.slurm or "-"), alerts,
        )  # fmt: skip
    return table


def _gpus_table(view: FleetView) -> Table | None:
    rows = [(n.name, g) for n in view.nodes for g in n.gpus]
    if not rows:
        return None
    table = _table("GPUs", ("node", "gpu", "util", "memory", "temp", "power"))
    for name, g in rows:
        memory = "-" if g.memory_used is None else f"{g.memory_used / 2**30:.1f} GiB"
        table.add_row(
            safe(name), safe(g.index), _pct(g.utilization), memory, _num(g.temperature, " C"), _num(g.power, " W")
        )
    return table


def _training_table(view: FleetView) -> Table | None:
    if not view.training:
        return None
    table = _table("training", ("run", "rank 0 on", "step", "loss", "tokens/s"))
    for t in view.training:
        table.add_row(safe(t.run), safe(t.node), _num(t.step, ""), _num(t.loss, "", 4), _num(t.tokens_per_second, ""))
    return table


def _alerts_table(view: FleetView) -> Table | None:
    if not view.alerts:
        return None
    table = _table("[red]alerts firing[/]", ("alert", "node", "summary"))
    for a in view.alerts:
        table.add_row(safe(a["name"]), safe(a["node"]), safe(a["summary"]))
    return table
