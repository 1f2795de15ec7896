"""`provision status` at fleet scale: one summary of the fleet, then only its exceptions.

A thousand rows hide the two hosts that matter, so the report is the counts, the versions
seen with how many hosts have each, and the hosts that are unreachable, drifted, waiting
for a reboot or missing a mount. Every function here is pure over ``HostStatus`` records,
so the selection is tested on a thousand records without a host.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from provision.scheduler import SlurmView
from provision.status.judge import HostStatus, mount_item

# Up to this many hosts, `status` prints every host's row as well: 20 rows fit one
# terminal screen beside the summary, so a testbed or a rack still reads host by host;
# past it the rows would push the exceptions off the screen (`--all` prints them anyway).
EVERY_HOST_UP_TO = 20

# What the summary counts the fleet's values of, in the order it prints them: the OS and
# kernel, then HostStatus.versions' keys.
SEEN_ITEMS = ("os", "kernel", "driver", "cuda", "fabricmanager", "torch", "nccl", "numpy")

NONE_SEEN = "-"  # the value counted for a host that has none of an item (not installed)

# Values of one item the summary names before it sums up the rest: a kernel per host on a
# mixed fleet would otherwise make one line of a thousand values.
SEEN_NAMED = 5


@dataclass(frozen=True)
class FleetSummary:
    """The counts and versions the summary's few lines show."""

    hosts: int  # every host in the inventory
    reachable: int  # hosts whose facts came back
    unreachable: int  # hosts that did not answer
    drifted: int  # reachable hosts with at least one drift (mounts included)
    reboot_pending: int  # reachable hosts waiting for a reboot
    mounts_not_ok: int  # reachable hosts with at least one mount not "ok"
    healthy: int  # hosts none of the above: the ones not listed by name
    seen: dict[str, list[tuple[str, int]]]  # item -> (value, hosts with it), most hosts first; reachable hosts only


@dataclass(frozen=True)
class Shared:
    """One exception and every host that has it, listed once: a fleet whose 900 hosts miss
    the same package reads as one row, not 900."""

    key: tuple[str, ...]  # unreachable: (why,); drift: (item, expected, actual); mounts: (mount, state)
    hosts: list[str]  # inventory names, in inventory order


@dataclass(frozen=True)
class Exceptions:
    """What the summary lists by name: everything but the healthy hosts."""

    unreachable: list[Shared]  # by why
    drift: list[Shared]  # by item, expected and actual; mounts left to `mounts`
    reboot_pending: list[str]  # host names
    mounts: list[Shared]  # by mount point and state, every one not "ok"


def healthy(s: HostStatus) -> bool:
    """Reachable, nothing drifted, no reboot waiting and every mount ok: not an exception."""
    return s.reachable and not s.drift and not s.reboot_pending and all(v == "ok" for v in s.mounts.values())


def summarize(statuses: list[HostStatus]) -> FleetSummary:
    up = [s for s in statuses if s.reachable]
    return FleetSummary(
        hosts=len(statuses),
        reachable=len(up),
        unreachable=len(statuses) - len(up),
        drifted=sum(1 for s in up if s.drift),
        reboot_pending=sum(1 for s in up if s.reboot_pending),
        mounts_not_ok=sum(1 for s in up if any(v != "ok" for v in s.mounts.values())),
        healthy=sum(1 for s in statuses if healthy(s)),
        seen={item: _counted(_value(s, item) for s in up) for item in SEEN_ITEMS},
    )


def _value(s: HostStatus, item: str) -> str:
    value = s.os if item == "os" else s.kernel if item == "kernel" else s.versions.get(item)
    return value or NONE_SEEN


def _counted(values: Any) -> list[tuple[str, int]]:
    # Most hosts first, then by value so the order is the same run to run.
    return sorted(Counter(values).items(), key=lambda vc: (-vc[1], vc[0]))


def seen_text(values: list[tuple[str, int]], named: int = SEEN_NAMED) -> str:
    """One item's values as the summary prints them: "580.95.05 x998, 570.172.08 x2", and
    "+ 3 more values on 4 hosts" past the first ``named``."""
    text = ", ".join(f"{value} x{hosts}" for value, hosts in values[:named])
    rest = values[named:]
    if rest:
        text += f", + {len(rest)} more values on {sum(n for _, n in rest)} hosts"
    return text or NONE_SEEN


def exceptions(statuses: list[HostStatus]) -> Exceptions:
    """The hosts to name, each exception once with its hosts, in inventory order."""
    unreachable: list[tuple[tuple[str, ...], str]] = []
    drift: list[tuple[tuple[str, ...], str]] = []
    mounts: list[tuple[tuple[str, ...], str]] = []
    reboot = []
    for s in statuses:
        if not s.reachable:
            unreachable.append(((s.error or "no answer",), s.name))
            continue
        mount_items = {mount_item(m) for m in s.mounts}
        drift += [((d.item, d.expected, d.actual), s.name) for d in s.drift if d.item not in mount_items]
        mounts += [((m, state), s.name) for m, state in s.mounts.items() if state != "ok"]
        if s.reboot_pending:
            reboot.append(s.name)
    return Exceptions(_shared(unreachable), _shared(drift), reboot, _shared(mounts))


def _shared(found: list[tuple[tuple[str, ...], str]]) -> list[Shared]:
    hosts: dict[tuple[str, ...], list[str]] = {}
    for key, host in found:
        hosts.setdefault(key, []).append(host)
    return [Shared(key, names) for key, names in hosts.items()]


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def host_ranges(names: list[str]) -> str:
    """Host names as few words as they take: runs of consecutive numbers joined the way
    Slurm's hostlists write them ("node-[0001-0005], gpu7"), the order kept."""
    runs: list[list[str]] = []
    for name in names:
        if runs and _follows(runs[-1][-1], name):
            runs[-1].append(name)
        else:
            runs.append([name])
    return ", ".join(_run_text(run) for run in runs)


def _follows(before: str, name: str) -> bool:
    a, b = _NUMBERED.match(before), _NUMBERED.match(name)
    if not (a and b and a[1] == b[1] and int(b[2]) == int(a[2]) + 1):
        return False
    # node-0009 then node-0010 keep their width; node9 then node10 are unpadded.
    return len(a[2]) == len(b[2]) or not (a[2].startswith("0") or b[2].startswith("0"))


def _run_text(run: list[str]) -> str:
    if len(run) == 1:
        return run[0]
    first, last = _NUMBERED.match(run[0]), _NUMBERED.match(run[-1])
    if first is None or last is None:  # not reached: _follows joins numbered names only
        return ", ".join(run)
    return f"{first[1]}[{first[2]}-{last[2]}]"


def lists_every_host(hosts: int, every: bool) -> bool:
    """Whether to print each host's row: asked for (--all), or a fleet small enough to read."""
    return every or hosts <= EVERY_HOST_UP_TO


def as_json(statuses: list[HostStatus], slurm: SlurmView | None = None) -> dict[str, Any]:
    """The `--json` report: every host in full, the summary's counts and versions, and
    Slurm's view (null where no host runs Slurm)."""
    summary = summarize(statuses)
    counts = {k: v for k, v in asdict(summary).items() if k != "seen"}
    seen = {item: [{"value": v, "hosts": n} for v, n in values] for item, values in summary.seen.items()}
    return {
        "schema": "provision.status.judge/1",
        "ok": all(s.reachable and not s.drift for s in statuses),
        "hosts": [asdict(s) for s in statuses],
        "summary": {**counts, "seen": seen},
        "slurm": None if slurm is None else asdict(slurm),
    }


# Node states that are Slurm working as it should; any other (drained, down, not
# responding...) is listed with its reason.
SLURM_WORKING = ("idle", "allocated", "mixed", "completing")


def slurm_exceptions(slurm: SlurmView) -> list[Shared]:
    """Nodes whose state is not one of SLURM_WORKING, grouped by state and reason."""
    found: list[tuple[tuple[str, ...], str]] = [
        ((st.state, st.reason), name) for name, st in slurm.nodes.items() if st.state not in SLURM_WORKING
    ]
    return _shared(found)


def slurm_line(slurm: SlurmView) -> str:
    """One line: the controller, node states counted, and the queue counted."""
    if slurm.error:
        return f"slurm (controller {slurm.controller}): no answer: {slurm.error}"
    states = ", ".join(f"{state} x{n}" for state, n in _counted(st.state for st in slurm.nodes.values())) or "no nodes"
    jobs = Counter(j.state for j in slurm.jobs)
    queue = f"{jobs.get('RUNNING', 0)} running, {jobs.get('PENDING', 0)} pending"
    others = sum(n for state, n in jobs.items() if state not in ("RUNNING", "PENDING"))
    return f"slurm (controller {slurm.controller}): {states}; queue: {queue}" + (f", {others} other" if others else "")
