"""Arguments and options that several commands share, declared once."""

from __future__ import annotations

import typer

InventoryArg = typer.Argument(..., help="pyinfra inventory file, e.g. inventories/testbed.py")
JsonOpt = typer.Option(False, "--json", help="print the result as JSON on stdout")
