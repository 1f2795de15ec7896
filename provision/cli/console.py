"""Terminal output shared by every command: one rich Console for people (stderr, so
stdout stays clean for --json), per-host progress, and the problem printer."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from provision.errors import ProvisionError

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout, nothing else mixed in."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def report_error(error: ProvisionError) -> None:
    """One line per problem, no traceback."""
    problems = getattr(error, "problems", None)
    for line in (str(p) for p in problems) if problems else str(error).splitlines() or ["failed"]:
        err.print(f"[bold red]error:[/] {line}", soft_wrap=True)


class HostProgress:
    """A live line per host saying what it is doing now ("base: apt.packages")."""

    def __init__(self, progress: Progress, hosts: list[str]):
        self._progress = progress
        self._tasks = {h: progress.add_task(h, status="waiting", total=None) for h in hosts}

    def __call__(self, host: str, text: str) -> None:
        task = self._tasks.get(host)
        if task is not None:
            self._progress.update(task, status=text)


@contextmanager
def host_progress(hosts: list[str], enabled: bool = True) -> Iterator[HostProgress]:
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description:<16}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not enabled,
    )
    with progress:
        yield HostProgress(progress, hosts)
