"""Which fact a host was dropped on while its step was prepared.

pyinfra answers a fact whose command fails, times out or prints what the fact cannot read
with the fact's default, takes the host out of the run (``state.fail_hosts``) and says so
only in its own log, which provision silences. Without this, such a host would simply run
no operations and be reported "done, 0 changed". FactWatch wraps each host's ``get_fact``
for the pass, notes the first fact after which the host was no longer active, and turns
that into the failure the summary shows.
"""

from __future__ import annotations

import time
from typing import Any


class FactWatch:
    """The first fact each watched host was dropped on, and how long it took."""

    def __init__(self, state: Any):
        self.state = state
        self.dropped_on: dict[str, tuple[str, float]] = {}  # host -> (fact, seconds it took)

    def watch(self, host: Any) -> None:
        asked = host.get_fact  # pyinfra's, bound to this host

        def get_fact(fact: Any, *args: Any, **kwargs: Any) -> Any:
            start = time.monotonic()
            value = asked(fact, *args, **kwargs)
            if host not in self.state.active_hosts and host.name not in self.dropped_on:
                self.dropped_on[host.name] = (getattr(fact, "__name__", str(fact)), time.monotonic() - start)
            return value

        host.get_fact = get_fact  # this pass's Host object only: the next pass builds new ones

    def why(self, host: Any) -> str | None:
        """Why pyinfra dropped the host while it was prepared, or None if it did not."""
        if host in self.state.active_hosts:
            return None
        fact, took = self.dropped_on.get(host.name, ("?", 0.0))
        limit = host.data.get("_timeout")
        if isinstance(limit, int | float) and took >= limit:
            return f"timed out in fact {fact} after {limit:.0f} s"
        return f"fact {fact} failed on the host (its command failed, or printed what it cannot read)"
