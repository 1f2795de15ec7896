"""Run an inventory file's Python, once, within a deadline, and build pyinfra's Inventory.

An inventory is a Python program (pyinfra's format), so loading one runs someone's code on
the controller. Here it runs exactly once per command (pyinfra's loader would run it once
more for a second look at its groups), within ``PROVISION_INVENTORY_TIMEOUT_S`` seconds
(default 30: a loop or a hung network call is stopped with one line, not a hang), with
anything it prints sent to stderr (stdout stays clean for ``--json``), and with
``sys.exit()`` an error rather than a silent exit 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from provision import values as v
from provision.errors import InputError, Problem
from provision.pyinfra_context import held

TIMEOUT_ENV = "PROVISION_INVENTORY_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 30.0


class _Deadline(SystemExit):
    """Raised into the inventory's code by SIGALRM. Not an Exception, so the code's own
    ``except Exception`` cannot swallow it; a SystemExit, so that when it lands in gevent's
    hub (the code sleeping in a patched time.sleep) the hub hands it to the main greenlet
    without printing a traceback."""


def timeout_s() -> float:
    """The deadline from the environment: a number of seconds, 0.1 to 3600 (NaN compared as
    0.1 and an infinity overflowed the timer, blamed on the inventory)."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.1 <= value <= 3600:
        raise InputError(
            Problem(TIMEOUT_ENV, f"{text!r} is not a number of seconds from 0.1 to 3600", "unset it for 30")
        )
    return value


def load(path: Path) -> tuple[Any, dict[str, Any]]:
    """pyinfra's Inventory from the file, and the file's top-level names (for the checks
    pyinfra's loader skips: a group that is a string or a dict, a host listed twice)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli import inventory as pyinfra_inventory
    from pyinfra_cli.util import PYTHON_CODES, exec_file

    PYTHON_CODES.clear()  # pyinfra caches compiled files by name; a long-lived process must see edits
    with _guarded(path), held(ctx_state, State()):
        attrs = exec_file(str(path), return_locals=True)
        problems = [p for name, value in attrs.items() for p in group_problems(path, name, value)]
        problems += member_problems(path, attrs) if not problems else []
        if problems:
            raise InputError(problems)
        groups = {k: val for k, val in attrs.items() if pyinfra_inventory._is_inventory_group(k, val)}
        original = pyinfra_inventory._get_groups_from_filename
        # pyinfra's loader would run the file a second time for its groups: hand it these.
        pyinfra_inventory._get_groups_from_filename = lambda _name: dict(groups)
        try:
            inventory = pyinfra_inventory.make_inventory_from_files(str(path), cwd=str(path.parent))
        finally:
            pyinfra_inventory._get_groups_from_filename = original
    return inventory, attrs


@contextlib.contextmanager
def _guarded(path: Path) -> Iterator[None]:
    """User code's failures as Problems; its stdout on stderr; a deadline."""
    from pyinfra_cli.exceptions import UnexpectedExternalError

    try:
        with _stdout_to_stderr(), _deadline(timeout_s()):
            yield
    except _Deadline:
        raise InputError(
            Problem(
                str(path),
                f"loading the inventory took longer than {timeout_s():g} s (a loop, or a call that hangs?)",
                f"an inventory must finish quickly; {TIMEOUT_ENV} sets the limit",
            )
        ) from None
    except SystemExit as e:
        raise InputError(
            Problem(str(path), f"the inventory called sys.exit({e.code!r})", "an inventory must not exit")
        ) from None
    except SyntaxError as e:
        raise InputError(
            Problem(f"{e.filename}:{e.lineno}", f"syntax error: {e.msg}", "fix the Python syntax")
        ) from None
    except UnexpectedExternalError as e:
        err = e.exception
        raise InputError(
            Problem(
                f"{e.filename}{_user_line(err, e.filename)}",
                f"raised {type(err).__name__}: {_one_line(err)}",
                "an inventory must run without errors",
            )
        ) from None
    except InputError:
        raise
    except Exception as e:  # pyinfra's own validation, e.g. an unknown @connector
        raise InputError(Problem(str(path), f"{type(e).__name__}: {_one_line(e)}")) from None
    except KeyboardInterrupt:  # the person's Ctrl-C: exit 130, as anywhere else
        raise
    except BaseException as e:  # the code's own BaseException subclass: still its failure
        raise InputError(
            Problem(str(path), f"raised {type(e).__name__}: {_one_line(e)}", "an inventory must run without errors")
        ) from None


def _one_line(err: BaseException) -> str:
    try:  # the inventory's own exception: its __str__ is its code's, and may raise too
        text = str(err)
    except BaseException:
        text = ""
    return " ".join(text.split()) or "(no message)"


def _user_line(err: BaseException, filename: str) -> str:
    frames = traceback.extract_tb(getattr(err, "_traceback", None) or err.__traceback__)
    lines = [f.lineno for f in frames if f.filename == filename]
    return f":{lines[-1]}" if lines else ""


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Both Python's sys.stdout and file descriptor 1 (os.system, subprocesses)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 at all: nothing to protect
        saved = -1
    if saved >= 0:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """SIGALRM interrupts the inventory's code between two bytecodes (gevent has patched
    threads, so no watchdog thread could). Only the main thread gets signals; elsewhere
    (a library caller's worker thread) the file runs without one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(_signum: int, _frame: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0.5)  # again, should a bare `except:` swallow this one
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def group_problems(path: Path, name: str, value: Any) -> list[Problem]:
    """Why a top-level name of the file is not a group pyinfra reads as meant. pyinfra
    skips a string or a dict silently (``storage = "node1"`` would mean "no storage
    host"), and reads a tuple as (hosts, data); a helper variable starts with '_'."""
    if name.startswith("_") or isinstance(value, ModuleType) or callable(value):
        return []
    # Anything else at the top level is read as a group: `storage = None` or a generator
    # (pyinfra reads one, but only once) would quietly mean "no storage host".
    label = v.shown(name)
    where = f"{path}: group {label}"
    fix = f"write {label} = ['node1', ...] (a list of host names or (name, data) tuples), or name a helper _{label}"
    if isinstance(value, tuple):
        if len(value) != 2 or not isinstance(value[0], list) or not isinstance(value[1], dict):
            return [Problem(where, "is a tuple but not (list of hosts, dict of group data)", fix)]
        value = value[0]
    if not isinstance(value, list):
        return [Problem(where, f"is a {type(value).__name__}, not a list of hosts", fix)]
    return [Problem(where, f"entry {host!r}: {why}", fix) for host in value if (why := _host_entry_problem(host))]


def _host_entry_problem(entry: Any) -> str | None:
    name = entry[0] if isinstance(entry, tuple) and len(entry) == 2 else entry
    if isinstance(name, str) and name.startswith("@"):
        # pyinfra reads "@terraform/...", "@docker/..." as a connector that runs a program,
        # here on the controller, to find its hosts: provision's hosts are named, over SSH.
        return "a name starting with '@' is a pyinfra connector, which runs a program to find hosts; name each host"
    if type(entry) is str:
        return None
    if type(entry) is tuple and len(entry) == 2 and type(entry[0]) is str and type(entry[1]) is dict:
        return None
    return "a host is a name or a (name, dict of host data) tuple"


def _entries(value: Any) -> list[Any]:
    return list(value[0] if isinstance(value, tuple) else value)


def group_entries(attrs: dict[str, Any]) -> dict[str, list[Any]]:
    """The file's groups and their host entries (a name, or a (name, data) tuple): a
    ``(hosts, data)`` group unwrapped to its hosts; helpers (``_x``) and non-groups left out."""
    return {k: _entries(v) for k, v in attrs.items() if not k.startswith("_") and isinstance(v, list | tuple)}


def member_problems(path: Path, attrs: dict[str, Any]) -> list[Problem]:
    """Hosts that the groups disagree on. pyinfra merges a host's data from every group that
    gives it, silently, and takes a bare name in a role group for a new host: so
    `storage = ["gpu09"]` (for gpu01) adds a host reached by its DNS name, and two groups
    giving one host two SSH ports connect to one of them. Both are refused: a host's data
    given twice must agree, and where hosts come with their data, a host named without
    data anywhere is a typo."""
    groups = group_entries(attrs)
    given: dict[str, dict[str, tuple[str, Any]]] = {}  # host -> key -> (group, value)
    problems = []
    for group, entries in groups.items():
        for entry in entries:
            if not isinstance(entry, tuple):
                continue
            name, data = entry
            given.setdefault(name, {})
            for key, value in data.items():
                first = given[name].get(key)
                if first is None:
                    given[name][key] = (group, value)
                elif first[1] != value:
                    problems.append(
                        Problem(
                            f"{path}: host {v.shown(name)}",
                            f"key {v.brief(key)} is {v.brief(first[1])} in group {first[0]} "
                            f"and {v.brief(value)} in group {group}",
                            "give a host's data once, in one group",
                        )
                    )
    if given:
        named = sorted({e for entries in groups.values() for e in entries if isinstance(e, str)} - set(given))
        for name in named:
            where = [g for g, entries in groups.items() if name in entries]
            problems.append(
                Problem(
                    f"{path}: group {where[0]}",
                    f"host {v.shown(name)} is named only here, without data, "
                    "while the other hosts come with theirs: a typo?",
                    f"name one of the inventory's hosts, or give it its data: ({name!r}, {{'ssh_hostname': ...}})",
                )
            )
    return problems
