"""What hosts say is printed as text: never parsed as rich markup (a ``[/x]`` in a host's
stderr crashed the `up` summary after the work was done), and no terminal escape sequence
from a host reaches the screen."""

from __future__ import annotations

import io

from rich.console import Console

from provision.cli import console, up
from provision.engine import Failure, HostResult, RunReport

HOSTILE = "exit 1: [/x] [bold]not bold[/bold] \x1b]0;retitled\x07 \x1b[2J cleared \x9b31m"


def _capture(monkeypatch) -> io.StringIO:
    buffer = io.StringIO()
    monkeypatch.setattr(up, "out", Console(file=buffer, width=400, highlight=False, color_system=None))
    return buffer


def test_up_summary_prints_host_stderr_with_markup_and_escapes_as_text(monkeypatch):
    buffer = _capture(monkeypatch)
    host = HostResult("node1", failures=[Failure("base", HOSTILE)], notes=[f"note {HOSTILE}"])
    up.print_summary(RunReport({"node1": host}))
    text = buffer.getvalue()
    assert "[/x] [bold]not bold[/bold]" in text
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\x9b" not in text
    assert "\\x1b]0;retitled\\x07" in text


def test_safe_keeps_newlines_and_tabs_and_shows_other_controls():
    assert console.plain("a\tb\nc\x1b[0m\x00") == "a\tb\nc\\x1b[0m\\x00"


def test_progress_lines_show_host_text_with_markup_as_text(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(console, "err", Console(file=buffer, width=400, color_system=None))
    with console.host_progress(["node1"], mode="live") as progress:
        progress("node1", HOSTILE)
    assert "[/x] [bold]not bold[/bold]" in buffer.getvalue()
    assert "\x1b]0;" not in buffer.getvalue()


def test_progress_log_lines_off_a_terminal_show_host_text_without_escape_sequences(capsys):
    with console.host_progress(["node1"], mode="lines") as progress:
        progress("node1", f"base: FAILED {HOSTILE}")
    logged = capsys.readouterr().err
    assert "node1: base: FAILED exit 1: [/x] [bold]not bold[/bold]" in logged
    assert "\x1b" not in logged
    assert "\\x1b]0;retitled" in logged


def test_an_emoji_code_in_a_value_is_printed_as_written(capsys):
    # --force-format gpu01:ABC printed "gpu01🔤": rich read ":abc:" as an emoji code.
    from provision.errors import InputError, Problem

    console.report_error(InputError(Problem("--force-format gpu01:ABC:", "x :smile: y")))
    said = capsys.readouterr().err
    assert "gpu01:ABC:" in said
    assert ":smile:" in said
