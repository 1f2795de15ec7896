"""Several pyinfra facts in one command: one round trip a host instead of one a fact.

`gather_facts` asks all the facts it wants of a host through one pyinfra fact made here,
whose command runs each fact's own command in turn between marker lines (with that
command's exit status), and whose process() hands each section to that fact's own
process(). On a thousand simulated hosts the six facts of `provision facts` cost 4.3 s of
controller CPU asked one by one and 1.0 s for one fact (pyinfra's argument handling per
fact call is most of it; BENCHMARKS.md, issue 20), and on a real fleet each fact is a
network round trip.

Each part keeps its fact's meaning: a required command that is missing is that fact's
MissingCommandError, a non-zero exit, no output or a value of None is that fact's failure,
an error in its process() is that fact's error; the other parts are unaffected.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field
from typing import Any

# A line no fact prints; fixed (not random per call) so that a captured host answers the
# same command every time (tests/standins/fleet_standin.py).
MARK = "@@provision-fact"


@dataclass
class Part:
    """One fact's section of the batch's output."""

    lines: list[str] = field(default_factory=list)
    exit: int | None = None  # its command's exit status; None: it never finished
    missing: str = ""  # the required command that was not there


@dataclass(frozen=True)
class Answer:
    """One fact's value, or why it has none."""

    value: Any = None
    error: str = ""  # "" when value holds the fact


def _command(fact: Any, kwargs: dict[str, Any], name: str) -> str:
    command = fact.command(**kwargs) if callable(fact.command) else fact.command
    required = fact.requires_command(**kwargs)
    begin, end = shlex.quote(f"{MARK} begin {name}"), shlex.quote(f"{MARK} end {name}")
    body = f"( {command} ); echo {end} $?"
    if required:
        missing = shlex.quote(f"{MARK} missing {name} {required}")
        body = f"if command -v {shlex.quote(str(required))} >/dev/null 2>&1; then {body}; else echo {missing}; fi"
    return f"echo {begin}; {body}"


def split(lines: list[str]) -> dict[str, Part]:
    """The batch's output, per fact name."""
    parts: dict[str, Part] = {}
    current: Part | None = None
    for line in lines:
        if not line.startswith(MARK + " "):
            if current is not None:
                current.lines.append(line)
            continue
        kind, name, *rest = line[len(MARK) + 1 :].split(" ")
        if kind == "begin":
            current = parts.setdefault(name, Part())
        elif kind == "end" and name in parts:
            parts[name].exit = int(rest[0]) if rest and rest[0].isdigit() else 1
            current = None
        elif kind == "missing" and name in parts:
            parts[name].missing = " ".join(rest)
            current = None
    return parts


def answers(wanted: dict[str, tuple[type, dict[str, Any]]], lines: list[str]) -> dict[str, Answer]:
    """Each wanted fact's value, read by its own process(), or its failure in words."""
    parts = split(lines)
    out: dict[str, Answer] = {}
    for name, (cls, _) in wanted.items():
        part = parts.get(name)
        fact = cls()
        if part is None or (part.exit is None and not part.missing):
            out[name] = Answer(error=f"fact {name}: the command did not finish on the host")
        elif part.missing:
            out[name] = Answer(error=f"fact {name}: MissingCommandError: {part.missing}")
        elif part.exit != 0:
            out[name] = Answer(error=f"fact {name}: the command failed on the host")
        else:
            try:
                value = fact.process(part.lines) if part.lines else fact.default()
            except Exception as e:  # a host's output this fact cannot read is this fact's alone
                out[name] = Answer(error=f"fact {name}: {type(e).__name__}: {e}".rstrip(": "))
                continue
            out[name] = (
                Answer(value) if value is not None else Answer(error=f"fact {name}: the command failed on the host")
            )
    return out


def batch_fact(wanted: dict[str, tuple[type, dict[str, Any]]]) -> type:
    """A pyinfra fact that runs every wanted fact's command in one shell on the host;
    its value is the raw lines (read with answers())."""
    from pyinfra.api import FactBase

    for name in wanted:
        if not name.isidentifier():
            raise ValueError(f"fact name {name!r}: a batch section needs an identifier")
    command = "; ".join(_command(cls(), kwargs, name) for name, (cls, kwargs) in wanted.items())
    digest = hashlib.sha256(command.encode()).hexdigest()[:12]

    class FactBatch(FactBase[list[str]]):
        def command(self) -> str:
            return command

        def process(self, output: list[str]) -> list[str]:
            return list(output)

    # pyinfra names a fact by module and class: one name per distinct batch.
    FactBatch.__name__ = FactBatch.__qualname__ = f"FactBatch_{digest}"
    FactBatch.name = f"{__name__}.FactBatch_{digest}"
    return FactBatch
