"""Arguments and options that several commands share, declared once."""

from __future__ import annotations

from enum import StrEnum

import typer

InventoryArg = typer.Argument(..., help="pyinfra inventory file, e.g. inventories/testbed.py")
JsonOpt = typer.Option(False, "--json", help="print the result as JSON on stdout")
LimitOpt = typer.Option(
    None,
    "--limit",
    metavar="HOSTS",
    help="only these hosts: comma-separated names, globs (gpu-0*) or groups (storage); each must match",
)


class ProgressChoice(StrEnum):
    """How a run over hosts shows its progress."""

    auto = "auto"  # the live display on a terminal, a line per step event off one
    live = "live"  # the live display, always
    lines = "lines"  # a timestamped line per host and step event on stderr, always


ProgressOpt = typer.Option(
    ProgressChoice.auto,
    "--progress",
    help="auto: a live display on a terminal, one line per host and step event off one (CI, nohup); live; lines",
)
