"""A fleet outlier is measured again, with the rest of the fleet idle, before it is failed.

The agents run on every node at once, each measuring only itself. Where nodes share
something underneath (VMs on one hypervisor, one storage backend, the testbed's one host
disk and two cores), a neighbour's burst can make a sound node look broken: on the
testbed, node2 once wrote at 73 MiB/s beside node1's 762, minutes after writing at 1,632
alone, and the demo's gate failed it. Only the fleet check is given this second look:
it compares nodes measured at the same moment, so it is the check their contention can
fool. Floors and datasheet figures are judged on the value as it comes.

The second figure is the one judged, and the reason keeps the first. A faulty part is as
slow the second time and still fails. The suspects of one run are measured again
together (bounded by one agent's deadline however many there are), so on shared
hardware a suspect shares it only with other suspects.
"""

from __future__ import annotations

from dataclasses import replace

from provision.metrics import METRICS
from provision.validate.records import Measurement

# The groups the agent measures (its --only); the links and the all-reduce across nodes
# come later from the controller and have their own bisection.
AGENT_GROUPS = frozenset({"cpu", "ram", "disk", "gpu", "allreduce"})
AGAIN = "measured again with the rest of the fleet idle"  # starts each note, for readers and tests


def groups(suspects: list[Measurement]) -> frozenset[str]:
    """The agent groups to run again for these values."""
    return frozenset(METRICS[m.metric].group for m in suspects) & AGENT_GROUPS


def merged(
    first: list[Measurement], suspects: list[Measurement], again: list[Measurement], why_not: str
) -> list[Measurement]:
    """``first`` with each suspect replaced by its second measurement, which says the first.

    ``again`` is what the second agent sent (maybe nothing: ``why_not`` then says why); a
    suspect it has no value for keeps its first figure, with the reason."""
    wanted = {(m.metric, m.device) for m in suspects if METRICS[m.metric].group in AGENT_GROUPS}
    second = {(m.metric, m.device): m for m in again}
    out = []
    for m in first:
        key = (m.metric, m.device)
        if key not in wanted:
            out.append(m)
            continue
        new = second.get(key)
        if new is None or new.value is None:
            why = (new.not_run if new is not None else "") or why_not or "the agent sent no value"
            out.append(replace(m, note=f"{AGAIN}: no value ({why})"))
            continue
        out.append(replace(new, note=f"{AGAIN}; first {m.value:.4g} with every node at once"))
    return out
