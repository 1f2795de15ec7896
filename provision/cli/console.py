"""Terminal output shared by every command: one rich Console for people (stderr, so
stdout stays clean for --json), per-host progress, and the problem printer."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from provision.errors import ProvisionError

# No emoji codes: ":abc:" in a host name or disk id (gpu01:ABC) printed as a symbol.
err = Console(stderr=True, highlight=False, emoji=False)
out = Console(highlight=False, emoji=False)


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


# Events that open, close or fail a host's step (the engine's texts): the ones the line
# log prints, and the ones that say whether a host is mid-step.
_ENDS = (": done", ": skipped", ": FAILED", "timed out", "unreachable", "not rebooted")
_FINAL = {"done", "failed", "unreachable"}


def is_milestone(text: str) -> bool:
    """A step event worth a line of its own (not each operation's start)."""
    return (
        text in _FINAL
        or text.endswith(": started")
        or any(end in text for end in _ENDS)
        or text.startswith(("reboot", "rollout:"))  # rollout: which wave a host is in, or why it is not run
    )


def is_final(text: str) -> bool:
    """The host is between steps, or finished, after this event."""
    return (
        text in _FINAL or text == "waiting" or any(end in text for end in _ENDS) or text.startswith("rollout: not run")
    )


def log_line(subject: str, text: str) -> None:
    """Progress off a terminal: one timestamped line on stderr, written at once (CI, nohup
    and the demo's pipe show a long run is alive), control characters shown as text."""
    sys.stderr.write(f"{time.strftime('%H:%M:%S')} {plain(subject)}: {plain(text)}\n")
    sys.stderr.flush()


class HostProgress:
    """Per-host progress: a live line per host on a terminal ("base: apt.packages"), or one
    log line per step event off one (CI, nohup), so a long run shows it is alive."""

    def __init__(self, progress: Progress, hosts: list[str], lines: bool):
        self._progress = progress
        self._lines = lines  # print a line per step event to stderr
        self._tasks = {h: progress.add_task(safe(h), status="waiting", total=None) for h in hosts}
        self.last = dict.fromkeys(hosts, "waiting")  # host -> its latest event

    def __call__(self, host: str, text: str) -> None:
        self.last[host] = text
        task = self._tasks.get(host)
        if task is not None:
            self._progress.update(task, status=safe(text))
        if self._lines and is_milestone(text):
            log_line(host, text)

    def in_flight(self) -> dict[str, str]:
        """Hosts mid-step, with what each was doing."""
        return {h: text for h, text in self.last.items() if not is_final(text)}


@contextmanager
def host_progress(hosts: list[str], enabled: bool = True, mode: str = "auto") -> Iterator[HostProgress]:
    """Progress for a run over hosts. ``mode`` auto: the live display on a terminal, lines
    off one. On Ctrl-C, says which hosts were mid-step before the run stops."""
    lines = enabled and (mode == "lines" or (mode == "auto" and not sys.stderr.isatty()))
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description:<16}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not enabled or lines,
    )
    with progress:
        tracker = HostProgress(progress, hosts, lines)
        try:
            yield tracker
        except KeyboardInterrupt:
            busy = tracker.in_flight()
            mid = ", ".join(f"{plain(h)} ({plain(text)})" for h, text in busy.items()) or "none"
            sys.stderr.write(f"interrupted; hosts mid-step: {mid}\n")
            raise
