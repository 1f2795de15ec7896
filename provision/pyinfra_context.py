"""pyinfra's process-wide context (its current State, Host, Config), set for a block and
always put back.

pyinfra's own ``ContextManager.use`` restores the previous value only when the block ends
normally: a block that raises (a bad inventory file, a fact that failed) leaves its object
installed for the rest of the process, and the next user of pyinfra in that process (a
test, a long-lived controller) runs against a stale State. Every provision module sets the
context through ``held`` instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def held(manager: Any, value: Any) -> Iterator[None]:
    """``manager`` (pyinfra.context.ctx_state, ctx_host, ...) holds ``value`` inside the
    block; what it held before is back afterwards, whether the block returned or raised."""
    before = manager.get()
    manager.set(value)
    try:
        yield
    finally:
        manager.set(before)
