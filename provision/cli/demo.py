"""`provision demo`: the whole pipeline on the local testbed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from provision.cli.console import err, out, print_json
from provision.demo.stages import DemoPaths, Stage, as_json, run_demo


def demo(
    nodes: int = typer.Option(2, "--nodes", min=1, max=4, help="testbed VMs (node1 is also the storage node)"),
    as_json_out: bool = typer.Option(False, "--json", help="print the stage summary as JSON on stdout"),
) -> None:
    """Run the whole pipeline against a local qemu testbed: testbed up, provision up,
    verify, validate --quick (JSON/HTML/JUnit reports), train across all nodes with
    checkpoints on NFS, back up the checkpoints and check a restore.

    Stages that finished stay finished: after an interruption or a failure, run the demo
    again and it continues where it stopped. The testbed stays up afterwards.

    Example: provision demo --nodes 2
    """
    paths = DemoPaths(Path("runs/demo").resolve(), Path("inventories/testbed.py").resolve())

    def announce(stage: Stage, status: str) -> None:
        # The status first: off a terminal rich cuts the rule at 80 columns, and the cut
        # once took "done in 982s" with it.
        err.rule(f"[bold]{stage.name}[/]: {status} -- {stage.what}")

    results, code = run_demo(paths, nodes, announce)
    if as_json_out:
        print_json(as_json(results))
    table = Table(title="provision demo")
    for column in ("stage", "result", "time", "what it said last", "reports and logs"):
        table.add_column(column)
    for r in results:
        style = {"done": "green", "done earlier": "green", "failed": "red"}.get(r.status, "dim")
        table.add_row(
            r.name,
            f"[{style}]{r.status}[/]",
            f"{r.seconds:.0f}s" if r.seconds else "-",
            escape(r.outcome) or "-",
            "\n".join(_relative(a) for a in r.artifacts) or "-",
        )
    (err if as_json_out else out).print(table)
    err.print(
        f"The testbed stays up: look around with `provision testbed ssh node1`, "
        f"check it with `provision status {paths.inventory}`, "
        "take it down with `provision testbed down`."
    )
    raise typer.Exit(code)


def _relative(path: str) -> str:
    """Paths under the working directory, as the user would type them."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
