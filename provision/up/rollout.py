"""Staged rollouts of `provision up`: a canary first, then waves, stopping on failure.

`up --canary N` runs every step on N hosts first and stops there if any of them fails;
the other hosts then go in waves of `--wave-size`, and the rollout stops after a wave in
which more than `--max-fail` of the hosts failed (default 0: any failure stops it). A
change that breaks hosts then breaks a few, not the fleet. Hosts the rollout never reached
are in the report as failed with "not run" and the reason, so the summary accounts for
every host and the exit code is 1.

The storage host (NFS server, backup target) goes in the first wave: the others mount from
it and back up to it. Without --canary and --wave-size, `up` is one wave of every host,
exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from provision.engine import HostResult, RunReport
from provision.engine.results import OnEvent, no_events
from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node

STEP = "rollout"  # the "step" a host that was never reached failed in


@dataclass(frozen=True)
class Rollout:
    """How `up` stages its hosts; the default is a single wave of all of them."""

    canary: int = 0  # hosts to run every step on first (0: no canary)
    wave_size: int = 0  # hosts per wave after the canary (0: all the rest at once)
    max_fail: float = 0.0  # the share of a wave's hosts that may fail before the rollout stops

    @property
    def staged(self) -> bool:
        return bool(self.canary or self.wave_size)


def parse_max_fail(text: str) -> float:
    """--max-fail as a share: "10%" or "0.1"; 0 to 1."""
    raw = text.strip()
    try:
        share = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise InputError(Problem(f"--max-fail {text}", "not a share of hosts", "e.g. 0, 5% or 0.05 (0 to 1)"))
    return share


def waves(nodes: list[Node], rollout: Rollout, first: str | None = None) -> list[list[Node]]:
    """The hosts in the order they are run, wave by wave; ``first`` (the storage host)
    leads the first wave."""
    if not rollout.staged:
        return [list(nodes)] if nodes else []
    ordered = sorted(nodes, key=lambda n: n.name != first)  # stable: inventory order otherwise
    planned = []
    if rollout.canary:
        planned.append(ordered[: rollout.canary])
        ordered = ordered[rollout.canary :]
    size = rollout.wave_size or max(1, len(ordered))
    planned += [ordered[i : i + size] for i in range(0, len(ordered), size)]
    return [wave for wave in planned if wave]


def stop_reason(index: int, wave: list[HostResult], rollout: Rollout, total: int) -> str | None:
    """Why the rollout stops after this wave, or None to go on."""
    failed = [r.name for r in wave if not r.ok]
    if not failed:
        return None
    what = _label(index, rollout, total)
    if index == 0 and rollout.canary:
        return f"the canary failed on {_names(failed)}"
    share = len(failed) / len(wave)
    if share > rollout.max_fail:
        return (
            f"{what}: {len(failed)} of {len(wave)} hosts failed ({_names(failed)}), "
            f"more than --max-fail {rollout.max_fail:.0%}"
        )
    return None


def run(
    cluster: Cluster,
    rollout: Rollout,
    run_wave: Callable[[Cluster], RunReport],
    on_event: OnEvent = no_events,
) -> RunReport:
    """Run ``run_wave`` on each wave of the cluster's hosts in turn (each wave a cluster of
    its hosts that still knows every host); stop after a wave that fails the rollout."""
    storage = cluster.storage_node()
    planned = waves(list(cluster.nodes), rollout, storage.name if storage else None)
    results: dict[str, HostResult] = {}
    for index, wave in enumerate(planned):
        if rollout.staged:
            for node in wave:
                on_event(node.name, f"{STEP}: {_label(index, rollout, len(planned))} ({len(wave)} hosts)")
        report = run_wave(cluster.part(wave))
        results.update(report.hosts)
        reason = stop_reason(index, [report.hosts[n.name] for n in wave], rollout, len(planned))
        if reason:
            for node in (n for later in planned[index + 1 :] for n in later):
                results[node.name] = HostResult(node.name)
                results[node.name].fail(STEP, f"not run: {reason}")
                on_event(node.name, f"{STEP}: not run, {reason}")
            break
    return RunReport({n.name: results[n.name] for n in cluster.nodes})


def _label(index: int, rollout: Rollout, total: int) -> str:
    if rollout.canary:
        return "canary" if index == 0 else f"wave {index} of {total - 1}"
    return f"wave {index + 1} of {total}"


def _names(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
