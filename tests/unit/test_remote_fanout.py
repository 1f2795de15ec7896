"""remote.on_all: the `parallel` setting caps how many hosts its SSH calls work on at once,
and gang work (a rendezvous across the nodes) gets every node at once whatever the cap."""

from __future__ import annotations

import threading
import time

from provision import remote
from provision.inventory import Node, SshTarget
from provision.settings import Settings


def _nodes(count: int, parallel: int = 0) -> list[Node]:
    target = SshTarget("10.0.0.1", 22, "root", None, None, "yes")
    return [Node(f"n{i}", target, (), Settings(parallel=parallel), {}) for i in range(count)]


class _Busy:
    """Counts calls running at the same moment."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.lock = threading.Lock()

    def __call__(self, node: Node) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        return node.name


def test_the_smallest_parallel_a_node_asks_for_caps_the_calls_at_once():
    nodes = _nodes(12, parallel=3)
    busy = _Busy()
    results = remote.on_all(nodes, busy)
    assert list(results) == [n.name for n in nodes]  # every host, in input order
    assert busy.most == 3
    assert remote.fanout(nodes[:5] + _nodes(2, parallel=2)) == 2


def test_without_the_setting_the_default_fanout_applies():
    assert remote.fanout(_nodes(100)) == remote.FANOUT


def test_gang_work_runs_every_node_at_once_past_the_cap():
    # A barrier of all the nodes: with a queue of 2, the first two would wait for peers that
    # cannot start until they end (the all-reduce's rendezvous), and the barrier would break.
    nodes = _nodes(6, parallel=2)
    barrier = threading.Barrier(len(nodes), timeout=5)
    results = remote.on_all(nodes, lambda n: barrier.wait() >= 0, together=True)
    assert len(results) == 6
    assert all(results.values())
