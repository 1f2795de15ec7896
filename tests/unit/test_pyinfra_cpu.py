"""engine/pyinfra_cpu: each change to pyinfra gives pyinfra's own answers, from less CPU."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from copy import deepcopy

import pytest


def test_pyinfras_global_arguments_are_worked_out_once_and_unchanged():
    # new_state caches pyinfra's all_global_arguments (a typing.get_type_hints per fact
    # and per connection otherwise); the answer is what pyinfra itself computes.
    from typing import get_type_hints

    from pyinfra.api import arguments

    from provision.engine.pyinfra_cpu import cache_global_arguments

    cache_global_arguments()
    cache_global_arguments()  # twice: wrapped once, not a cache of a cache
    assert arguments.all_global_arguments() == list(get_type_hints(arguments.AllArguments).items())
    assert arguments.all_global_arguments() is arguments.all_global_arguments()
    assert not hasattr(arguments.all_global_arguments.__wrapped__, "cache_info")


def test_pyinfras_command_templates_are_split_once_and_build_the_same_commands():
    # new_state keeps the shlex split of pyinfra's command templates (12 % of a converged
    # up's CPU); the commands built must be exactly pyinfra's own.
    import shlex

    from pyinfra.api import command
    from pyinfra.api.command import QuoteString, make_formatted_string_command

    from provision.engine.pyinfra_cpu import cache_command_templates

    template = "! (test -e {0} || test -L {0} ) || ( stat -c 'x=%U' {0} 2> /dev/null )"
    path = "/home/o'brien/a b"
    before = make_formatted_string_command(template, QuoteString(path)).get_raw_value()
    cache_command_templates()
    cache_command_templates()  # twice: patched once
    assert command.shlex.split is not shlex.split
    assert make_formatted_string_command(template, QuoteString(path)).get_raw_value() == before
    assert make_formatted_string_command(template, QuoteString("/x")).get_raw_value() != before
    assert command.shlex.split(template) is command.shlex.split(template)  # kept, not split again
    assert command.shlex.quote is shlex.quote
    assert shlex.split("a 'b c'") == ["a", "b c"]  # the real module is untouched


def test_the_collector_runs_less_often_and_is_never_made_more_frequent():
    import gc

    from provision.engine.pyinfra_cpu import GC_FULL_AFTER, GC_YOUNG_THRESHOLD, collect_garbage_less_often

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        collect_garbage_less_often()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 20, GC_FULL_AFTER)
        gc.set_threshold(GC_YOUNG_THRESHOLD * 2, 5, 5)  # an embedding program's own choice stays
        collect_garbage_less_often()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD * 2, 5, 5)
    finally:
        gc.set_threshold(*before)


def _fleet_state():
    """A pyinfra Inventory and State whose hosts set global arguments in every layer."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(
        (
            [("plain", {}), ("set", {"_sudo": True, "_timeout": 30, "_env": {"A": "1"}, "other": 1})],
            {"_sudo_user": "ops"},
        ),
        group=(["set"], {"_timeout": 45, "_chdir": "/srv"}),
        override_data={"_shell_executable": "bash"},
    )
    return inventory, State(inventory, Config(ENV={"FROM_CONFIG": "1"}))  # _env's handler adds it


CALLS = [
    {},
    {"name": "an operation", "_sudo": False, "packages": ["a"]},
    {"_timeout": 5, "_env": {"B": "2"}, "path": "/x"},
    {"_retries": 2, "_retry_delay": 1, "_ignore_errors": True},
]


@pytest.mark.parametrize("deploy", [False, True], ids=["no-deploy", "in-a-deploy"])
@pytest.mark.parametrize("config_context", [False, True], ids=["state-config", "context-config"])
def test_global_arguments_are_popped_as_pyinfras_own_function_pops_them(deploy, config_context):
    # Every fact and operation pops pyinfra's global arguments; provision's version reads
    # the host's data without an exception per missing key, and must give pyinfra's
    # answer: the same arguments, the same keys found, the same keywords left behind.
    import contextlib

    from pyinfra.api import Config
    from pyinfra.api.arguments import pop_global_arguments as pyinfras
    from pyinfra.context import ctx_config

    from provision.engine import pyinfra_cpu
    from provision.engine.pyinfra_state import _merged_host_data

    inventory, state = _fleet_state()
    for host in inventory:
        host.data._use_sudo_login = True  # pyinfra's override layer, as a deploy sets it,
        host.data._timeout = 7  # over every other layer
        if deploy:
            host.current_deploy_kwargs = {"_sudo_user": "deployer", "_timeout": 99}
            host.current_deploy_data = {"_preserve_sudo_env": True, "_chdir": "/deploy"}
        with ctx_config.use(Config(SUDO=True, ENV={"C": "2"})) if config_context else contextlib.nullcontext():
            for call in CALLS:
                theirs_kwargs, ours_kwargs = deepcopy(call), deepcopy(call)
                theirs = pyinfras(state, host, theirs_kwargs)
                plain = host.data
                host.data = _merged_host_data(host, inventory)
                host.data.override_datas.update(plain.override_datas)
                try:
                    ours = pyinfra_cpu.pop_global_arguments(pyinfras, state, host, ours_kwargs)
                finally:
                    host.data = plain
                assert ours == theirs, (host.name, call)
                assert ours_kwargs == theirs_kwargs, (host.name, call)
        host.current_deploy_kwargs = host.current_deploy_data = None


def test_a_global_argument_of_the_wrong_type_is_refused_as_pyinfra_refuses_it():
    from pyinfra.api.arguments import ArgumentTypeError
    from pyinfra.api.arguments import pop_global_arguments as pyinfras

    from provision.engine import pyinfra_cpu
    from provision.engine.pyinfra_state import _merged_host_data

    inventory, state = _fleet_state()
    host = inventory.get_host("set")
    with pytest.raises(ArgumentTypeError, match="Invalid argument `_timeout`") as theirs:
        pyinfras(state, host, {"_timeout": "soon"})
    host.data = _merged_host_data(host, inventory)
    with pytest.raises(ArgumentTypeError, match="Invalid argument `_timeout`") as ours:
        pyinfra_cpu.pop_global_arguments(pyinfras, state, host, {"_timeout": "soon"})
    assert str(ours.value) == str(theirs.value)


def test_pyinfras_modules_all_pop_global_arguments_the_fast_way_and_pyinfras_own_host_data_still_works():
    import sys

    from pyinfra.api import arguments

    from provision.engine import pyinfra_cpu

    pyinfra_cpu.read_global_arguments_without_exceptions()
    pyinfra_cpu.read_global_arguments_without_exceptions()  # twice: patched once
    fast = arguments.pop_global_arguments
    assert getattr(fast, "provision_fast", False)
    assert fast.args[0].__module__ == "pyinfra.api.arguments"  # wraps pyinfra's, not itself
    for name in ("pyinfra.api.deploy", "pyinfra.api.facts", "pyinfra.api.operation"):  # the modules, not
        assert sys.modules[name].pop_global_arguments is fast, name  # pyinfra.api's decorators
    users = {m.__name__ for m in sys.modules.values() if "pop_global_arguments" in getattr(m, "__dict__", {})}
    assert {u for u in users if u.startswith("pyinfra")} == set(pyinfra_cpu.USERS_OF_POP_GLOBAL_ARGUMENTS)

    inventory, state = _fleet_state()  # pyinfra's own HostData: pyinfra's own function answers
    popped, found = fast(state, inventory.get_host("set"), {"_sudo": False, "x": 1})
    assert (popped["_sudo"], popped["_timeout"], found) == (False, 30, ["_sudo"])


def _fact_classes():
    """Every fact class of pyinfra and of provision whose command takes arguments."""
    import pyinfra.facts
    from pyinfra.api import FactBase

    import provision.facts

    for package in (pyinfra.facts, provision.facts):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, FactBase)
                    and value.__module__ == module.__name__
                    and callable(getattr(value, "command", None))
                    and len(inspect.signature(value.command).parameters) > 1
                ):
                    yield value


def test_fact_arguments_are_bound_as_inspects_getcallargs_binds_them():
    # pyinfra binds a fact's arguments to its command with inspect.getcallargs; provision
    # keeps each command's signature. For every fact of pyinfra's and provision's that
    # takes arguments, given all of them by position, then the required ones by name:
    # the same mapping (self included), and a wrong call refused alike.
    from provision.engine.pyinfra_cpu import getcallargs

    classes = list(_fact_classes())
    assert len(classes) > 40
    for cls in classes:
        params = [p for name, p in inspect.signature(cls.command).parameters.items() if name != "self"]
        positional = [f"value-{p.name}" for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = {
            p.name: f"named-{p.name}" for p in params if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD
        }
        fact = cls()
        assert getcallargs(fact.command, *positional) == inspect.getcallargs(fact.command, *positional), cls
        assert getcallargs(fact.command, **required) == inspect.getcallargs(fact.command, **required), cls
        wrong_calls = [((*positional, "one too many"), {}), ((), {**required, "not_a_parameter": 1})]
        if required:
            first = next(iter(required))
            wrong_calls += [((), {}), (("by position",), {first: "and by name"})]  # missing; given twice
        for args, kwargs in wrong_calls:
            with pytest.raises(TypeError):
                inspect.getcallargs(fact.command, *args, **kwargs)
            with pytest.raises(TypeError):
                getcallargs(fact.command, *args, **kwargs)


def test_a_function_with_star_arguments_is_bound_by_inspect_itself():
    from provision.engine.pyinfra_cpu import getcallargs

    def command(path, *more, mode="644", **rest):
        return path

    assert getcallargs(command, "/a", "/b", user="x") == inspect.getcallargs(command, "/a", "/b", user="x")


@pytest.mark.parametrize("value", ["text", 3, 2.5, True, None, ["a"], {"A": "1"}, ("t",), b"bytes", object()], ids=repr)
def test_a_global_argument_is_type_checked_as_typeguard_checks_it(value):
    # Values that are instances of a plain class skip typeguard; what is accepted and what
    # is refused, for every global argument's type, stays typeguard's answer.
    from pyinfra.api.arguments import ArgumentTypeError, all_global_arguments
    from pyinfra.api.util import raise_if_bad_type

    from provision.engine.pyinfra_cpu import _check_type

    for key, type_ in all_global_arguments():
        try:
            raise_if_bad_type(value, type_, ArgumentTypeError, f"Invalid argument `{key}`:")
            theirs = None
        except ArgumentTypeError as refused:
            theirs = str(refused)
        try:
            _check_type(value, type_, key)
            ours = None
        except ArgumentTypeError as refused:
            ours = str(refused)
        assert ours == theirs, (key, type_)


def test_pyinfras_facts_bind_their_arguments_with_the_kept_signatures():
    from pyinfra.api import facts

    from provision.engine import pyinfra_cpu

    pyinfra_cpu.cache_fact_signatures()
    pyinfra_cpu.cache_fact_signatures()
    assert facts.getcallargs is pyinfra_cpu.getcallargs
