"""Where a sweep's trials run without a scheduler: each node, or each GPU of a node, is a
slot, and a queue hands free slots to trials, at most ``parallel`` at once.

A trial that fails is given another slot when it is retried (a bad node should not eat
all of a trial's tries), and only a bounded number of times. A node that is lost (SSH no
longer answers) takes all its slots out of the queue; when no slot is left, a waiting
trial is told so instead of waiting forever. Under Slurm none of this is used: each trial
is a job and the scheduler places it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Slot:
    node: str
    gpu: int | None = None  # None: the whole node (a CPU node, or one trial per node)

    def __str__(self) -> str:
        return self.node if self.gpu is None else f"{self.node}:gpu{self.gpu}"


def node_slots(gpus_by_node: dict[str, int], *, per_gpu: bool) -> list[Slot]:
    """The slots of these nodes: one per GPU where ``per_gpu`` and the node has GPUs, else
    one per node. In inventory order, so trials spread over nodes before doubling up."""
    slots: list[Slot] = []
    for node, gpus in gpus_by_node.items():
        if per_gpu and gpus > 0:
            slots += [Slot(node, i) for i in range(gpus)]
        else:
            slots.append(Slot(node))
    # Interleave: node1:gpu0, node2:gpu0, node1:gpu1... (sorted by GPU index, stable by node)
    return sorted(slots, key=lambda s: s.gpu or 0)


class NoSlotsLeft(RuntimeError):
    """Every slot's node was lost: nothing can run."""


@dataclass
class _TrialRecord:
    failed_on: set[Slot] = field(default_factory=set)
    failures: int = 0


class SlotQueue:
    """Free slots for trials; thread-safe (one thread per running trial takes and gives)."""

    def __init__(self, slots: Iterable[Slot], *, parallel: int, retries: int):
        self._free: list[Slot] = list(dict.fromkeys(slots))  # order kept, duplicates dropped
        if not self._free:
            raise ValueError("a slot queue needs at least one slot")
        if parallel < 1:
            raise ValueError(f"parallel must be 1 or more, not {parallel}")
        self.parallel = parallel
        self.retries = retries
        self._busy: set[Slot] = set()
        self._lost_nodes: set[str] = set()
        self._trials: dict[int, _TrialRecord] = {}
        self._changed = threading.Condition()

    def take(self, trial: int, timeout_s: float | None = None) -> Slot | None:
        """A free slot for ``trial``, waiting while ``parallel`` are busy or none is free:
        one the trial has not failed on when there is such a slot alive. None when
        ``timeout_s`` passes first; NoSlotsLeft when every node is lost."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            while True:
                if not self._free and not self._busy:
                    raise NoSlotsLeft("every node with a slot was lost")
                slot = self._pick(trial)
                if slot is not None:
                    self._free.remove(slot)
                    self._busy.add(slot)
                    return slot
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._changed.wait(left)

    def _pick(self, trial: int) -> Slot | None:
        if len(self._busy) >= self.parallel or not self._free:
            return None
        failed_on = self._trials.get(trial, _TrialRecord()).failed_on
        fresh = [s for s in self._free if s not in failed_on]
        if fresh:
            return fresh[0]
        # Every free slot saw this trial fail. Wait for a busy one it has not failed on;
        # take a free one only when no such slot exists any more.
        if any(s not in failed_on for s in self._busy):
            return None
        return self._free[0]

    def give_back(self, slot: Slot, trial: int, *, failed: bool = False, node_lost: bool = False) -> None:
        """``trial`` is done with ``slot``. ``failed``: the trial failed there (it counts
        against its retries, and it prefers another slot next time). ``node_lost``: the
        node stopped answering; all its slots leave the queue."""
        with self._changed:
            self._busy.discard(slot)
            if failed or node_lost:
                record = self._trials.setdefault(trial, _TrialRecord())
                record.failures += 1
                record.failed_on.add(slot)
            if node_lost:
                self._lost_nodes.add(slot.node)
                self._free = [s for s in self._free if s.node != slot.node]
            elif slot.node not in self._lost_nodes:
                self._free.append(slot)
            self._changed.notify_all()

    def may_retry(self, trial: int) -> bool:
        """Whether ``trial`` has tries left after its failures so far."""
        with self._changed:
            return self._trials.get(trial, _TrialRecord()).failures <= self.retries

    def lost_nodes(self) -> set[str]:
        with self._changed:
            return set(self._lost_nodes)

    def busy(self) -> int:
        with self._changed:
            return len(self._busy)
