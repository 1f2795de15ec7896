"""The order a host's operations run in."""

from __future__ import annotations

from typing import Any


def host_op_order(host: Any) -> list[str]:
    """The operations prepared for this host, in order.

    pyinfra's ``state.get_op_order()`` sorts every host's operations into one order (a
    graph of all hosts' operations, built afresh at each call); asked once per host, as
    a no-wait run does, a pass cost the square of the fleet (x9 for x3 hosts at 300,
    BENCHMARKS.md, issue 20). A host's own list is already in the order its operations
    were added, which is the order the global sort keeps for that host."""
    return list(host.op_hash_order)
