"""What the hosts of one pass share: an answer worked out once for the pass (every node's
host keys, every node's facts for slurm.conf), not once per host.

pyinfra prepares the hosts of a pass side by side, each in its own greenlet, and a deploy
that needs every host's facts reads them from inside one host's preparation. Without a lock
each host prepared at once did the whole read itself: ``parallel`` hosts times the pass's
hosts in fact commands (40 x 1,000 at pyinfra's default on a thousand hosts). Here the first
host to ask does the work, reading the hosts side by side, and the others wait for its answer.

Answers are kept per pyinfra State (one pass), weakly: a finished pass's answers go with it,
and a new State never meets an old one's answers.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_answers: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


@functools.cache
def _lock() -> threading.RLock:
    # Made at first use, inside a run: pyinfra's CLI has patched threading with gevent by
    # then, so a waiting host yields to the others instead of blocking the process.
    return threading.RLock()


def once_per_pass(key: str, compute: Callable[[], T]) -> T:
    """Inside a deploy: ``compute()``'s answer for this pass, worked out by the first host
    that asks; the others wait for it and share it."""
    from pyinfra.context import ctx_state

    current = ctx_state.get()
    with _lock():
        answers = _answers.setdefault(current, {})
        if key not in answers:
            answers[key] = compute()
        return answers[key]  # type: ignore[no-any-return]


def each_connected_host(read: Callable[[Any], T]) -> dict[str, T]:
    """``read(host)`` for every connected pyinfra host of this pass, side by side; a host
    whose read raises is left out (its own preparation reports its failure)."""
    import gevent
    from pyinfra.context import ctx_state

    hosts = [h for h in ctx_state.get().inventory if h.connected]
    jobs = {h.name: gevent.spawn(read, h) for h in hosts}
    gevent.joinall(list(jobs.values()))
    return {name: job.value for name, job in jobs.items() if job.successful()}
