"""Deadlines for a pyinfra pass: each host's own clock, so one host that hangs (a wedged
disk, an sshd that stops answering mid-session) is stopped at its deadline and reported
`timed out in <step> after N s` while every other host finishes and is reported in full.

Three bounds together: pyinfra's connect timeout (Config.CONNECT_TIMEOUT), a deadline on
every command (host data ``_timeout``, set in pyinfra_state), and here a wall deadline on
each host's whole step, preparing (facts) and executing (operations) alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

from provision.engine.op_order import host_op_order
from provision.pyinfra_context import held

DISCONNECT_TIMEOUT_S = 30.0  # closing a wedged connection must not hang the caller


def within(seconds: float, work: Callable[[], object]) -> bool:
    """Run ``work``; False when it ran past ``seconds`` and was stopped there."""
    import gevent

    timer = gevent.Timeout(max(seconds, 0.001))
    timer.start()
    try:
        work()
    except gevent.Timeout as e:
        if e is not timer:
            raise
        return False
    finally:
        timer.close()
    return True


class HostClocks:
    """Each host's time spent on one step, against the step's deadline per host."""

    def __init__(self, limit_s: dict[str, float]):
        self.limit_s = limit_s  # host name -> its step deadline (settings.step_timeout_s)
        self.spent: dict[str, float] = dict.fromkeys(limit_s, 0.0)  # host name -> seconds used so far

    def left(self, name: str) -> float:
        return self.limit_s[name] - self.spent[name]

    def run(self, name: str, work: Callable[[], object]) -> bool:
        """Run one host's work against its time left; False when it ran out."""
        start = time.monotonic()
        try:
            return within(self.left(name), work)
        finally:
            self.spent[name] += time.monotonic() - start


def run_ops_bounded(state: Any, clocks: HostClocks, on_time_out: Callable[[Any], None]) -> None:
    """pyinfra's no-wait run (each host runs all its operations without waiting for the
    others) with each host stopped at its own deadline; ``on_time_out(host)`` for those."""
    import gevent
    from pyinfra.context import ctx_state

    hosts = list(state.active_hosts)
    state.is_executing = True
    with held(ctx_state, state):
        greenlets = [state.pool.spawn(clocks.run, h.name, partial(_host_ops, state, h)) for h in hosts]
        gevent.joinall(greenlets)
    for host, greenlet in zip(hosts, greenlets, strict=True):
        if greenlet.value is False:
            on_time_out(host)


def in_parallel(state: Any, work: Callable[[Any], object]) -> None:
    """``work(host)`` for every active host at once, each in its own greenlet.

    pyinfra's current state (``ctx_state``) is one global, not a greenlet-local like
    ``ctx_host``; ``add_deploy`` sets it with ``ctx_state.use(state)`` and puts back what it
    found when it returns. Held here for the whole pass, every greenlet's ``use`` finds it
    already set and leaves it alone: otherwise the first host to finish preparing resets it,
    and a host still preparing adds its next operation against the State class itself
    ("get_meta_for_host() missing 1 required positional argument", seen on a 2-node up)."""
    import gevent
    from pyinfra.context import ctx_state

    with held(ctx_state, state):
        gevent.joinall([state.pool.spawn(work, host) for host in list(state.active_hosts)])


def quiet_interrupts() -> None:
    """Ctrl-C reaches the main greenlet as KeyboardInterrupt, there and only there (the
    CLI says which hosts were mid-step), and gevent's hub does not print it first as an
    error of its own.

    Python raises KeyboardInterrupt in whichever greenlet holds the interpreter when the
    signal lands. With SSH connections open, that is often a paramiko reader's "thread",
    whose bootstrap swallows it, and the run went on (Ctrl-C ignored for minutes, seen on
    loopback). So SIGINT goes to gevent's own watcher instead, which runs in the hub and
    throws the interrupt into the main greenlet. Only where SIGINT has Python's default
    handler: a background job's ignored SIGINT stays ignored, another handler stays."""
    import signal
    import threading

    import gevent

    global _ctrl_c_routed
    hub = gevent.get_hub()
    if KeyboardInterrupt not in hub.NOT_ERROR:
        hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)
    if _ctrl_c_routed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        gevent.signal_handler(signal.SIGINT, hub.handle_system_error, KeyboardInterrupt, KeyboardInterrupt())
        _ctrl_c_routed = True


_ctrl_c_routed = False  # SIGINT goes to gevent's watcher (quiet_interrupts), once a process


def _host_ops(state: Any, host: Any) -> None:
    """One host's operations in order, stopping at the first that fails (as pyinfra does);
    the callbacks record each result."""
    from pyinfra.api.operations import run_host_op
    from pyinfra.context import ctx_host

    for op_hash in host_op_order(host):
        with held(ctx_host, host):
            if not run_host_op(state, host, op_hash):
                return


def disconnect_bounded(state: Any) -> None:
    import gevent
    from pyinfra.api.connect import disconnect_all

    with gevent.Timeout(DISCONNECT_TIMEOUT_S, False):
        disconnect_all(state)
