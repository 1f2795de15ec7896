"""Terminal output shared by every command: one rich Console for people (stderr, so
stdout stays clean for --json), per-host progress, and the problem printer."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from provision.errors import ProvisionError

err = Console(stderr=True, highlight=False)
out = Console(highlight=False)


# C0 and C1 control characters but newline and tab: an escape sequence from a host (or
# in a value) would move the cursor, retitle the terminal or hide what follows.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: object) -> str:
    """Text from a host or a person, with control characters shown as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def safe(value: object) -> str:
    """Text from a host or a person, ready to put inside rich markup: never parsed as
    markup (a host's ``[/x]`` would crash the print) and with no escape sequence left."""
    return escape(plain(value))


def print_json(data: Any) -> None:
    """Machine-readable output on stdout, nothing else mixed in."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def report_error(error: ProvisionError) -> None:
    """One line per problem, no traceback."""
    problems = getattr(error, "problems", None)
    for line in (str(p) for p in problems) if problems else str(error).splitlines() or ["failed"]:
        err.print(f"[bold red]error:[/] {safe(line)}", soft_wrap=True)


class HostProgress:
    """A live line per host saying what it is doing now ("base: apt.packages")."""

    def __init__(self, progress: Progress, hosts: list[str]):
        self._progress = progress
        self._tasks = {h: progress.add_task(safe(h), status="waiting", total=None) for h in hosts}

    def __call__(self, host: str, text: str) -> None:
        task = self._tasks.get(host)
        if task is not None:
            self._progress.update(task, status=safe(text))


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
