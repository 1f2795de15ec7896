"""What provision changes in pyinfra so that a pass's controller CPU grows with the fleet
and no faster (issue 20, BENCHMARKS.md).

pyinfra runs every host of a pass as a greenlet of one process, so at a thousand hosts a
converged `up` is bound by that one core. Each change here does what pyinfra does, with
the same answers (tests/unit/test_pyinfra_cpu.py holds each against pyinfra's own code),
and keeps work that pyinfra redoes at every fact or operation. apply() is called by
new_state() before every pass; each change is made once per process."""

from __future__ import annotations

import functools
import importlib
import inspect
import shlex
import types
from collections.abc import Callable
from typing import Any

GC_YOUNG_THRESHOLD = 10_000


def apply() -> None:
    cache_global_arguments()
    cache_command_templates()
    collect_garbage_less_often()
    read_global_arguments_without_exceptions()
    cache_fact_signatures()


def cache_global_arguments() -> None:
    """pyinfra works out its global arguments' names and types (typing.get_type_hints of a
    fixed TypedDict) afresh for every fact asked and every host connected: at 1,000 hosts,
    a sixth of the controller's CPU in `provision facts`. The answer never changes within
    a process, so it is worked out once. Its callers only iterate over the list."""
    from pyinfra.api import arguments

    if not hasattr(arguments.all_global_arguments, "cache_info"):
        arguments.all_global_arguments = functools.cache(arguments.all_global_arguments)


@functools.cache
def global_argument_names() -> frozenset[str]:
    from pyinfra.api import arguments

    return frozenset(name for name, _ in arguments.all_global_arguments())


def cache_command_templates() -> None:
    """pyinfra builds the command of many of its facts (File, Directory, Sha1File...) from
    a fixed template it shlex-splits afresh at each call: 12 % of the controller's CPU in
    a converged `up` of 400 simulated hosts. A split depends only on its template, so it
    is kept; bounded, as a caller could pass a string of its own."""
    from pyinfra.api import command

    if getattr(command.shlex, "provision_cached", False):
        return

    @functools.lru_cache(maxsize=512)
    def split(text: str) -> tuple[str, ...]:
        return tuple(shlex.split(text))  # a tuple: a caller cannot change the kept answer

    cached = types.ModuleType("shlex")  # the real module's every name, with split kept
    cached.__dict__.update(vars(shlex))
    cached.__dict__.update(split=split, provision_cached=True)
    command.shlex = cached


def collect_garbage_less_often() -> None:
    """Python's default collector thresholds (700 new objects) run a young collection every
    few hundred allocations and, now and then, a full one over the whole heap, which grows
    with the fleet: in a converged `up` of 1,000 simulated hosts, 10,620 collections took
    6.6 of its 45 s of controller CPU (15 %; 5 % at 100 hosts). Every 10,000 allocations:
    248 collections, 1.6 s, peak RSS 259 MiB (every 50,000: 0.8 s, but 379 MiB). A full
    collection then still came once a converged `up` of 1,000 hosts and took 1.5 s of its
    28 (it walks every object of the pass); after 100 middle collections instead of 10, it
    comes about once in 14 such runs, for 58 MiB more peak RSS (373 MiB). A controller's
    objects live for a pass and go, freed as their count drops; the full collection only
    finds the cycles among them. Process-wide, so set once, as pyinfra's own patches are;
    thresholds already higher (an embedding program's) stay."""
    import gc

    if gc.get_threshold()[0] < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, 20, GC_FULL_AFTER)


GC_FULL_AFTER = 100  # middle collections between two full ones (Python's default: 10)


def read_global_arguments_without_exceptions() -> None:
    """pyinfra's pop_global_arguments, run for every fact asked and every operation, looks
    each of its 32 global arguments up in the host's data with getattr, and almost none
    is set: each miss raises and catches an AttributeError. At 300 simulated hosts that
    was 29 % of a converged `up`'s controller CPU. provision's host data (pyinfra_state's
    MergedHostData) hands over the ones it sets in one dict instead; everything else is
    pyinfra's loop, step for step. A host whose data is pyinfra's own still gets
    pyinfra's function. pyinfra imports the function by name into three modules."""
    from pyinfra.api import arguments

    if getattr(arguments.pop_global_arguments, "provision_fast", False):
        return
    original = arguments.pop_global_arguments
    fast = functools.partial(pop_global_arguments, original)
    fast.provision_fast = True  # type: ignore[attr-defined]
    # By module path: pyinfra.api's own names `operation` and `deploy` are its decorators.
    for name in USERS_OF_POP_GLOBAL_ARGUMENTS:
        module = importlib.import_module(name)
        names = vars(module)
        assert names.get("pop_global_arguments") is original, name  # a pyinfra that moved it fails here
        names["pop_global_arguments"] = fast


USERS_OF_POP_GLOBAL_ARGUMENTS = (
    "pyinfra.api.arguments",
    "pyinfra.api.deploy",
    "pyinfra.api.facts",
    "pyinfra.api.operation",
)


def pop_global_arguments(original: Callable[..., Any], state: Any, host: Any, kwargs: dict[str, Any]) -> Any:
    """pyinfra's pop_global_arguments (pyinfra/api/arguments.py, 3.10), the host's defaults
    read in one call. Order of precedence, as pyinfra's: the call's own keyword arguments,
    then the running deploy's, then the host's data, then pyinfra's config default."""
    from pyinfra.context import ctx_config

    reader = getattr(host.data, "global_argument_values", None)
    if reader is None:
        return original(state, host, kwargs)
    config = ctx_config.get() if ctx_config.isset() else state.config
    meta_kwargs: dict[str, Any] = host.current_deploy_kwargs or {}
    host_values = reader()
    arguments: dict[str, Any] = {}
    found_keys: list[str] = []
    for key, type_, config_default, handler in _argument_table():
        default = host_values[key] if key in host_values else config_default(config)
        if key in kwargs:
            found_keys.append(key)
            value = kwargs.pop(key)
        else:
            value = meta_kwargs.get(key, default)
        if handler:
            value = handler(config, value)
        if value != default:
            _check_type(value, type_, key)
        arguments[key] = value
    return arguments, found_keys


@functools.cache
def _argument_table() -> tuple[tuple[str, Any, Callable[[Any], Any], Callable[[Any, Any], Any] | None], ...]:
    """Each global argument's name, type, config default and handler, in pyinfra's order."""
    from pyinfra.api.arguments import all_argument_meta, all_global_arguments

    return tuple(
        (key, type_, all_argument_meta[key].default, all_argument_meta[key].handler)
        for key, type_ in all_global_arguments()
    )


def _check_type(value: Any, type_: Any, key: str) -> None:
    """pyinfra's raise_if_bad_type (typeguard), which every operation's name and every fact
    asked inside it went through. For a plain class typeguard accepts every instance (and,
    for int, float and complex, some more), so an instance is taken without it; anything
    else is typeguard's to accept or refuse."""
    from pyinfra.api.arguments import ArgumentTypeError
    from pyinfra.api.util import raise_if_bad_type

    if type(type_) is type and isinstance(value, type_):
        return
    raise_if_bad_type(value, type_, ArgumentTypeError, f"Invalid argument `{key}`:")


def cache_fact_signatures() -> None:
    """pyinfra binds a fact's arguments to its command with inspect.getcallargs, which
    builds the command's signature afresh at every fact asked: 6 % of a converged `up`'s
    controller CPU at 300 simulated hosts (inspect's Signature.bind, tried next, still
    4 %). A function's parameters never change, so they are kept and bound as
    getcallargs binds them."""
    from pyinfra.api import facts

    if getattr(facts.getcallargs, "provision_cached", False):
        return
    facts.getcallargs = getcallargs


@functools.lru_cache(maxsize=1024)
def _parameters(function: Callable[..., Any]) -> tuple[tuple[str, ...], dict[str, Any]] | None:
    """The names and defaults of a function's parameters when all of them can be given by
    position or by name (every fact command's), else None."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters), {p.name: p.default for p in parameters if p.default is not p.empty}


def getcallargs(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """inspect.getcallargs's mapping of parameter names to values (``self`` included for a
    bound method, defaults filled in, a call that does not fit a TypeError) from kept
    parameter lists; a function with *args, **kwargs or keyword-only ones is inspect's."""
    bound_to = getattr(func, "__self__", None)
    function = getattr(func, "__func__", func)
    shape = _parameters(function)
    if shape is None:
        return inspect.getcallargs(func, *args, **kwargs)
    names, defaults = shape
    if bound_to is not None:
        args = (bound_to, *args)
    if len(args) > len(names):
        raise TypeError(f"{function.__qualname__}() takes {len(names)} positional arguments but {len(args)} were given")
    bound = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name not in names or name in bound:
            raise TypeError(f"{function.__qualname__}() got an unexpected or repeated argument {name!r}")
        bound[name] = value
    for name in names:
        if name not in bound:
            if name not in defaults:
                raise TypeError(f"{function.__qualname__}() missing required argument: {name!r}")
            bound[name] = defaults[name]
    return bound


getcallargs.provision_cached = True  # type: ignore[attr-defined]
