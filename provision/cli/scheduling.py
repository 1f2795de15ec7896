"""--scheduler as `tune` and `run` take it: auto's choice (said), or the one asked for,
which Slurm must be able to take. (`train` has its own: an elastic run and --requeue
change what auto may choose.)"""

from __future__ import annotations

from collections.abc import Callable

from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node


def chosen(cluster: Cluster, nodes: list[Node], asked: str, say: Callable[[str, str], None], what: str) -> str:
    """ "ssh" or "slurm"; bad input when Slurm is asked for nodes it does not run."""
    from provision import scheduler as scheduler_lib

    names = [n.name for n in nodes]
    if asked == "auto":
        return scheduler_lib.choose(cluster, names, say, what=what)
    if asked == "slurm" and (outside := scheduler_lib.not_compute(cluster, names)):
        raise InputError(
            Problem(
                "--scheduler slurm",
                f"not Slurm compute nodes: {', '.join(outside)}",
                "leave them out (--limit), or run over SSH (--scheduler ssh)",
            )
        )
    return asked
