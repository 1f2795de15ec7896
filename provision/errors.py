"""Typed errors. The library raises these; the CLI turns them into lines and exit codes.

Exit codes (docs/ARCHITECTURE.md): 0 success, 1 some host failed or some node did not pass,
2 bad input with nothing touched.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input, said so a person can fix it."""

    where: str  # file, and host/key when known: "inventories/x.py: host node1: key ssh_port"
    what: str  # what is wrong
    fix: str = ""  # what to do about it

    def __str__(self) -> str:
        line = f"{self.where}: {self.what}"
        return f"{line} ({self.fix})" if self.fix else line


def names_label(names: list[str], shown: int = 3) -> str:
    """Names as a problem lists them: "a, b, c and 7 more"."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{', '.join(names[:shown])}{more}"


def hosts_label(names: list[str]) -> str:
    """Hosts as a problem names them: "host a", or "hosts a, b, c and 7 more"."""
    return f"host {names[0]}" if len(names) == 1 else f"hosts {names_label(names)}"


class ProvisionError(Exception):
    """Base of every error the CLI knows how to report without a traceback."""

    exit_code = EXIT_FAILED


class InputError(ProvisionError):
    """Bad input: nothing was contacted or changed. Holds one Problem per issue found."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[Problem] | Problem):
        self.problems = problems if isinstance(problems, list) else [problems]
        super().__init__("\n".join(str(p) for p in self.problems))


class TestbedError(ProvisionError):
    """The local VM testbed could not do what was asked (missing tool, VM did not boot)."""
