"""engine/pyinfra_state: what it changes in pyinfra for every pass."""

from __future__ import annotations


def test_pyinfras_global_arguments_are_worked_out_once_and_unchanged():
    # new_state caches pyinfra's all_global_arguments (a typing.get_type_hints per fact
    # and per connection otherwise); the answer is what pyinfra itself computes.
    from typing import get_type_hints

    from pyinfra.api import arguments

    from provision.engine.pyinfra_state import cache_global_arguments

    cache_global_arguments()
    cache_global_arguments()  # twice: wrapped once, not a cache of a cache
    assert arguments.all_global_arguments() == list(get_type_hints(arguments.AllArguments).items())
    assert arguments.all_global_arguments() is arguments.all_global_arguments()
    assert not hasattr(arguments.all_global_arguments.__wrapped__, "cache_info")
