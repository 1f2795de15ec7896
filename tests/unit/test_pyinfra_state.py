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


def test_a_pass_works_on_as_many_hosts_at_once_as_the_smallest_parallel_setting_asks():
    from dataclasses import replace

    from provision.engine.pyinfra_state import pass_parallel
    from provision.inventory import Node, SshTarget
    from provision.settings import Settings

    def node(name: str, parallel: int) -> Node:
        target = SshTarget(name, 22, "root", None, None, "yes")
        return Node(name, target, (), replace(Settings(), parallel=parallel), {})

    assert pass_parallel([node("a", 0), node("b", 0)]) == 0  # pyinfra's choice
    assert pass_parallel([node("a", 0), node("b", 25), node("c", 50)]) == 25
    assert pass_parallel([]) == 0
