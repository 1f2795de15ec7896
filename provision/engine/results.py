"""Typed results of a run: what each host did, what a plan would do, and the facts gathered.

Records only; the engine fills them and the `up`, `plan` and `facts` commands report them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from provision.errors import EXIT_FAILED, EXIT_OK
from provision.inventory import Node

OnEvent = Callable[[str, str], None]  # (host, text): progress for the display and the log


def no_events(host: str, text: str) -> None:
    """The default OnEvent: progress goes nowhere."""


@dataclass(frozen=True)
class Failure:
    """Why a host failed, and in which step (or phase: "reboot", "reboot check")."""

    step: str  # the step or phase that failed
    why: str  # what happened, for people

    def __str__(self) -> str:
        return f"{self.step}: {self.why}"


@dataclass(frozen=True)
class TimedOut(Failure):
    """A host that did not finish a step (or phase) within its deadline; the run went on
    with the others. Built with TimedOut.after(step, seconds)."""

    seconds: float = 0.0  # the deadline it ran past

    @classmethod
    def after(cls, step: str, seconds: float) -> TimedOut:
        return cls(step, f"timed out in {step} after {seconds:.0f} s", seconds)

    def __str__(self) -> str:
        return self.why


@dataclass
class HostResult:
    """What happened on one host across a run."""

    name: str  # inventory name
    reachable: bool = True  # False once a connection failed
    steps: list[str] = field(default_factory=list)  # steps that ran to the end on this host
    changed: int = 0  # operations that changed something, all steps together
    changed_by_step: dict[str, int] = field(default_factory=dict)  # step -> operations it changed
    failures: list[Failure] = field(default_factory=list)  # each failure with its step
    notes: list[str] = field(default_factory=list)  # "nvidia: skipped (no NVIDIA GPU)" and similar
    rebooted: bool = False  # whether the run rebooted this host

    @property
    def ok(self) -> bool:
        return self.reachable and not self.failures

    def fail(self, step: str, why: str) -> None:
        self.failures.append(Failure(step, why))

    def time_out(self, step: str, seconds: float) -> None:
        self.failures.append(TimedOut.after(step, seconds))

    def failed_in(self, step: str) -> bool:
        return any(f.step == step for f in self.failures)

    def count_change(self, step: str) -> None:
        self.changed += 1
        self.changed_by_step[step] = self.changed_by_step.get(step, 0) + 1

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reachable": self.reachable,
            "steps": list(self.steps),
            "changed": self.changed,
            "changed_by_step": dict(self.changed_by_step),
            "failures": [str(f) for f in self.failures],
            "notes": list(self.notes),
            "rebooted": self.rebooted,
            "ok": self.ok,
        }


@dataclass
class RunReport:
    """Per-host results of one run, in inventory order."""

    hosts: dict[str, HostResult]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(h.ok for h in self.hosts.values()) else EXIT_FAILED

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": "provision.run/1",
            "ok": self.exit_code == EXIT_OK,
            "hosts": [h.as_json() for h in self.hosts.values()],
        }


@dataclass(frozen=True)
class Step:
    """One named step of `provision up`: a pyinfra @deploy applied to the hosts it concerns."""

    name: str  # "base", "nvidia", ... as typed after --only/--skip
    deploy: Callable[[], Any]  # a @deploy("...") function; reads its Node via current_node()
    doc: str  # one line for --help and the plan
    applies: Callable[[Node], str | None] = lambda node: None  # a reason to skip this host, or None


@dataclass
class PlannedOp:
    """One operation that would change something on a host."""

    name: str  # the operation's name, e.g. "Install base packages"
    commands: list[str]  # shell commands it would run, uploads as "upload SRC -> DEST"
    diffs: list[str] = field(default_factory=list)  # unified diff per file it would write


@dataclass
class HostPlan:
    """What `up` would do on one host, step by step, without doing it."""

    name: str  # inventory name
    reachable: bool = True  # False when the host could not be contacted
    steps: dict[str, list[PlannedOp]] = field(default_factory=dict)  # step -> changing ops
    refused: list[str] = field(default_factory=list)  # "step: reason" that would stop the host
    notes: list[str] = field(default_factory=list)  # skipped steps and the like

    @property
    def changes(self) -> int:
        return sum(len(ops) for ops in self.steps.values())


@dataclass
class FactsResult:
    """Facts gathered from each host; hosts that could not be reached carry the reason."""

    facts: dict[str, dict[str, Any]]  # host -> fact name -> processed value (every fact answered)
    failed: dict[str, str]  # host -> why it has no facts: unreachable, or a fact that failed
