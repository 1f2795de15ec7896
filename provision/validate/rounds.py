"""Which node pairs measure their link when, and which node a slow link is blamed on. Pure.

Rounds: every node is in at most one pair per round, so all pairs of a round run at once
without sharing a NIC. quick: a ring (each node against its two neighbours); full: every
pair, by the circle method (n-1 rounds for even n, n for odd n), while that is no more
than the ring plus ``peers`` links per node; past that (999 rounds at 1,000 nodes) the ring
plus ``peers`` random partners per node, the same ones every run for the same nodes.

Bisect: a slow pair (a, b) says "a or b or the path between them". Testing each end
against a third node c whose links are healthy tells which: the end whose pair with c is
slow too is at fault; if neither is, the a-b path itself is (blamed on both, said so).
"""

from __future__ import annotations

import hashlib
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

Pair = tuple[str, str]


def ring_rounds(nodes: list[str]) -> list[list[Pair]]:
    """Ring pairs (i, i+1), scheduled in 2 rounds (3 when the ring is odd)."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [[(nodes[0], nodes[1])]]
    edges = [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]
    rounds = [edges[0 : n - (n % 2) : 2], edges[1 : n - (n % 2) : 2]]
    if n % 2:
        rounds.append([edges[-1]])  # the closing edge meets both other rounds
    return [r for r in rounds if r]


def all_pairs_rounds(nodes: list[str]) -> list[list[Pair]]:
    """Every pair exactly once; circle method (one node sits out per round when n is odd)."""
    ring: list[str | None] = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(ring)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(a, b) for a, b in pairs if a is not None and b is not None])
        ring = [ring[0], ring[-1], *ring[1:-1]]  # keep the first, rotate the rest
    return [r for r in rounds if r]


FULL_PEERS = 8  # full mode's random partners per node beyond the ring, on fleets too large for every pair


def full_rounds(nodes: list[str], peers: int = FULL_PEERS) -> tuple[list[list[Pair]], str]:
    """Full mode's schedule and what it tests, in words for the report: every pair while
    that costs no more rounds than the ring plus ``peers`` partners a node, else those."""
    if len(nodes) - 1 <= peers + 2:
        return all_pairs_rounds(nodes), "every pair"
    return bounded_rounds(nodes, peers), f"ring + {peers} random peers per node (the same for the same nodes)"


def bounded_rounds(nodes: list[str], peers: int) -> list[list[Pair]]:
    """The ring's pairs plus, for each node, ``peers`` partners drawn at random, scheduled
    greedily into rounds where no node is in two pairs. The draw is seeded by the node
    names, so a re-run measures the same links and its figures compare with the last."""
    seed = int.from_bytes(hashlib.sha256("\n".join(nodes).encode()).digest()[:8], "big")
    rng = random.Random(seed)
    index = {name: i for i, name in enumerate(nodes)}
    edges: set[Pair] = set()

    def add(a: str, b: str) -> None:
        edges.add((a, b) if index[a] < index[b] else (b, a))

    for rnd in ring_rounds(nodes):
        for a, b in rnd:
            add(a, b)
    for i, node in enumerate(nodes):
        others = nodes[:i] + nodes[i + 1 :]
        for partner in rng.sample(others, min(peers, len(others))):
            add(node, partner)
    rounds: list[list[Pair]] = []
    busy: list[set[str]] = []
    for a, b in sorted(edges, key=lambda e: (index[e[0]], index[e[1]])):
        k = next((k for k, used in enumerate(busy) if a not in used and b not in used), len(rounds))
        if k == len(rounds):
            rounds.append([])
            busy.append(set())
        rounds[k].append((a, b))
        busy[k] |= {a, b}
    return rounds


@dataclass(frozen=True)
class PairResult:
    """One measured link."""

    a: str  # client node
    b: str  # server node
    gbits: float | None  # received throughput; None when the test failed
    round: int  # round index (-1 for bisect tests)
    error: str = ""  # why gbits is None


def slow_pairs(results: list[PairResult], drop: float = 0.25) -> list[PairResult]:
    """Pairs more than ``drop`` below the median pair (or failed outright)."""
    values = [r.gbits for r in results if r.gbits is not None]
    if not values:
        return []
    median = statistics.median(values)
    return [r for r in results if r.gbits is None or r.gbits < (1 - drop) * median]


def bisect(
    slow: list[PairResult],
    results: list[PairResult],
    nodes: list[str],
    measure: Callable[[str, str], float | None],
    drop: float = 0.25,
) -> tuple[dict[str, str], list[PairResult]]:
    """Blame each slow pair on a node. Returns ({node: reason}, extra pair results).

    ``measure(x, c)`` runs one more link test; c is the node whose links are fastest
    among those not in the slow pair.
    """
    values = [r.gbits for r in results if r.gbits is not None]
    median = statistics.median(values) if values else 0.0
    floor = (1 - drop) * median
    blamed: dict[str, str] = {}
    extra: list[PairResult] = []
    for pair in slow:
        c = _referee(pair, results, nodes)
        if c is None:
            for node in (pair.a, pair.b):
                blamed.setdefault(
                    node, f"slow link {pair.a}-{pair.b} ({_g(pair.gbits)}); no third node to tell which end"
                )
            continue
        checks = {x: measure(x, c) for x in (pair.a, pair.b)}
        extra += [PairResult(x, c, g, -1) for x, g in checks.items()]
        bad = _worse_ends(checks, floor)
        for node in bad or [pair.a, pair.b]:
            detail = ", ".join(f"{x}-{c} {_g(g)}" for x, g in checks.items())
            where = "" if bad else "the path between them: "
            blamed.setdefault(
                node,
                f"{where}slow link {pair.a}-{pair.b} ({_g(pair.gbits)}) bisected "
                f"against {c}: {detail}; pair median {median:.3g} Gbit/s",
            )
    return blamed, extra


# Both ends' checks below the floor, yet one at more than this many times the other: the
# lower one is the fault and the other only noise (a busy host measures a healthy link a
# little low, while a degraded one is off by far more).
CLEARLY_WORSE = 2.0


def _worse_ends(checks: dict[str, float | None], floor: float) -> list[str]:
    """The ends of a slow pair whose link to the referee is slow too; of two slow ones,
    only the clearly worse (a failed check is worst of all)."""
    bad = [x for x, g in checks.items() if g is None or g < floor]
    if len(bad) < 2:
        return bad
    values = {x: checks[x] or 0.0 for x in bad}
    best = max(values.values())
    worst = [x for x, g in values.items() if g * CLEARLY_WORSE < best]
    return worst or bad


def _g(gbits: float | None) -> str:
    return "failed" if gbits is None else f"{gbits:.3g} Gbit/s"


def _referee(pair: PairResult, results: list[PairResult], nodes: list[str]) -> str | None:
    """The node (not a or b) with the best worst link: the most trusted third party."""
    worst: dict[str, float] = {}
    for r in results:
        for node in (r.a, r.b):
            value = r.gbits if r.gbits is not None else 0.0
            worst[node] = min(worst.get(node, value), value)
    others = [n for n in nodes if n not in (pair.a, pair.b)]
    return max(others, key=lambda n: worst.get(n, 0.0), default=None)


def node_values(
    results: list[PairResult], nodes: list[str], blamed: dict[str, str]
) -> dict[str, tuple[float | None, str]]:
    """Per node: median throughput of its pairs, leaving out pairs with a blamed partner
    (a healthy node must not look slow because its neighbour is), and a detail line."""
    out: dict[str, tuple[float | None, str]] = {}
    for node in nodes:
        mine = [r for r in results if node in (r.a, r.b)]
        partner = {id(r): r.b if r.a == node else r.a for r in mine}
        fair = [r for r in mine if partner[id(r)] not in blamed or node in blamed]
        use = fair or mine
        values = [r.gbits for r in use if r.gbits is not None]
        detail = ", ".join(f"{partner[id(r)]} {_g(r.gbits)}" for r in use)
        out[node] = (statistics.median(values) if values else None, detail)
    return out
