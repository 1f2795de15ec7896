"""Hosts prepared side by side (engine.deadlines.in_parallel) share pyinfra's one global state."""

from __future__ import annotations

import types

import gevent
import gevent.pool
from pyinfra.context import ctx_state

from provision.engine.deadlines import in_parallel


def test_a_host_still_preparing_sees_the_state_after_another_host_finished():
    # add_deploy wraps each host's preparation in ctx_state.use(state); host b is still
    # reading a fact (the sleep) when host a is done. b's next operation must still find the
    # state, not the State class (the 2-node `up` failure: get_meta_for_host() missing 'host').
    state = types.SimpleNamespace(pool=gevent.pool.Pool(), active_hosts=["a", "b"])
    seen: dict[str, bool] = {}

    def prepare(host: str) -> None:
        with ctx_state.use(state):
            gevent.sleep(0 if host == "a" else 0.01)
            seen[host] = ctx_state.get() is state

    before = ctx_state.get()
    in_parallel(state, prepare)
    assert seen == {"a": True, "b": True}
    assert ctx_state.get() is before  # put back as it was found


def test_a_bad_inventory_file_leaves_no_state_behind(tmp_path):
    # pyinfra's own ctx_state.use() restores only on a normal exit: a refused inventory left a
    # stale State installed for the rest of the process (it failed the test above in CI).
    from provision import inventory_file
    from provision.errors import InputError

    path = tmp_path / "inventory.py"
    path.write_text('nodes = "not a list"\n')
    before = ctx_state.get()
    try:
        inventory_file.load(path)
    except InputError:
        pass
    else:
        raise AssertionError("a group that is a string must be refused")
    assert ctx_state.get() is before
