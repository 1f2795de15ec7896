"""pyinfra's own keys in an inventory (``ssh_*`` connection data, ``_*`` global arguments):
which a host may carry, and what each may hold.

pyinfra passes them to its connector and into the commands it builds, unquoted where they
are a program and untyped everywhere, so each is checked here by the type pyinfra gives it
and, where root runs or works in what it names, against paths someone else could change.
"""

from __future__ import annotations

import math
import re
from typing import Any

from provision import values as v
from provision.errors import Problem
from provision.settings import is_pyinfra_key, key_label, type_ok
from provision.values import Check

# Values of ssh_strict_host_key_checking that provision honours the same way in pyinfra
# (up, plan, facts) and in fabric/OpenSSH (validate, train, backup, verify). pyinfra's
# "ask" needs a terminal per host, which a parallel run cannot give.
HOST_KEY_POLICIES = ("yes", "accept-new", "no", "off")


def _program(value: Any) -> str | None:
    """A shell or program for pyinfra to run every command with, as root: one word (a name
    or a path; "sh -c id;" would run id in every command), not in a home, whose owner could
    change it under root. (Elsewhere the path is the inventory author's choice: the tests
    give a host a shell in pytest's temporary directory that never answers.)"""
    if not isinstance(value, str) or not re.fullmatch(r"/?[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*", value):
        return f"{v.brief(value)} is not a program name or path (one word of letters, digits and ._+-/)"
    if v.inside(value, "/home"):
        return f"{value!r} is in a home directory, which its owner can change under root"
    return None


def _root_dir(value: Any) -> str | None:
    """A directory root's commands work in or upload through: absolute, and not in a home
    (where its owner could swap what root then runs or copies into place)."""
    problem = v.absolute_path(value)
    if problem is None and v.inside(value, "/home"):
        return f"{value!r} is in a home directory, which its owner can change under root"
    return problem


def port_problem(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return None
    return f"{v.brief(value)} is not a port number (1-65535)"


# Variables a host's commands (root's, through sudo) may not be given: those that make root
# run code or read configuration from wherever they point (the loader's, the shells', the
# interpreters' apt and debconf run, pip's and apt's configuration, root's home and temp).
# Proxies, locale and the like pass. A TLS-inspecting proxy needs its CA bundle: those name
# a file, which must be root's (not in a home or /tmp).
_ENV_REFUSED = re.compile(
    r"LD_\w*|PATH|BASH_ENV|ENV|SHELLOPTS|BASHOPTS|PS4|IFS|CDPATH|GLOBIGNORE|PROMPT_COMMAND|BASH_FUNC_\w*"
    r"|PYTHON\w*|PERL\w*|RUBY\w*|NODE_OPTIONS|\w*JAVA\w*OPTIONS|APT_CONFIG|DPKG_\w*|PIP_\w*|UV_\w*|GIT_\w*"
    r"|GCONV_PATH|HOSTALIASES|LOCPATH|NLSPATH|MALLOC_\w*|TMPDIR|HOME|XDG_\w*|SUDO_\w*",
    re.IGNORECASE,
)
_ENV_CA_FILES = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE", "PIP_CERT")


def _env(value: Any) -> str | None:
    names_ok = isinstance(value, dict) and all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in value
    )
    if not names_ok or not all(isinstance(x, str) and x.isprintable() for x in value.values()):
        return f"{v.brief(value)} is not a dict of environment variable names to one-line strings"
    refused = sorted(k for k in value if _ENV_REFUSED.fullmatch(k) and k not in _ENV_CA_FILES)
    if refused:
        index = " (a package index goes in pip_index_url)" if any("INDEX" in k for k in refused) else ""
        return (
            f"{', '.join(refused)}: not given to root's commands{index}: the loader's, shells', interpreters' "
            "and package tools' variables would make root run code or read configuration from where they point"
        )
    for name in (k for k in value if k in _ENV_CA_FILES):
        path = value[name]
        if v.absolute_path(path) is not None or v.inside(path, "/home") or v.inside(path, "/tmp"):
            return f"{name}: {path!r} is not a root-owned absolute path (not in a home or /tmp) of a CA bundle"
    return None


def _paramiko_kwargs(value: Any) -> str | None:
    # Where and as whom to connect are the inventory's own keys, checked above.
    reserved = {"hostname", "port", "username", "password", "pkey", "key_filename", "sock", "passphrase"}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and not reserved & set(value):
        return None
    return f"{value!r} is not a dict of paramiko options other than {', '.join(sorted(reserved))}"


def _of_type(kind: type, low: float | None = None) -> Check:
    """A value of pyinfra's type for the key (settings' own rule: a bool is not an int, a
    float is any finite number), at least ``low`` when given."""
    bound = v.bounded(low, math.inf) if low is not None else None

    def check(value: Any) -> str | None:
        if type_ok(value, kind) and not (bound and bound(value)):
            return None
        wanted = f"a {kind.__name__}" if low is None else f"a {kind.__name__} of {low:g} or more"
        return f"{v.brief(value)} is not {wanted}"

    return check


# pyinfra's keys an inventory may give, each with the check of its value. pyinfra passes
# them to its connector and into the commands it builds, unquoted where they are a program
# (`_shell_executable: "sh -c id;"` would run `id` as root on every command) and untyped
# everywhere (`_sudo: "false"` is a true value). Operation arguments (`_ignore_errors`,
# `_if`, `_run_once`...) have no place in host data: they would change what `up` reports.
PYINFRA_VALUE_CHECKS: dict[str, Check] = {
    "ssh_hostname": v.address,
    "ssh_port": port_problem,
    "ssh_user": v.user_name,
    "ssh_password": _of_type(str),
    "ssh_key": v.controller_path,
    "ssh_key_password": _of_type(str),
    "ssh_allow_agent": _of_type(bool),
    "ssh_look_for_keys": _of_type(bool),
    "ssh_forward_agent": _of_type(bool),
    "ssh_config_file": v.controller_path,
    "ssh_known_hosts_file": v.controller_path,
    "ssh_paramiko_connect_kwargs": _paramiko_kwargs,
    "ssh_connect_retries": _of_type(int, 0),
    "ssh_connect_retry_min_delay": _of_type(float, 0),
    "ssh_connect_retry_max_delay": _of_type(float, 0),
    "ssh_file_transfer_protocol": lambda x: None if x in ("sftp", "scp") else f"{x!r} is not 'sftp' or 'scp'",
    "_sudo": _of_type(bool),
    "_sudo_user": v.user_name,
    "_use_sudo_login": _of_type(bool),
    "_sudo_password": _of_type(str),
    "_preserve_sudo_env": _of_type(bool),
    "_su_user": v.user_name,
    "_use_su_login": _of_type(bool),
    "_preserve_su_env": _of_type(bool),
    "_su_shell": _program,
    "_su_password": _of_type(str),
    "_doas": _of_type(bool),
    "_doas_user": v.user_name,
    "_shell_executable": _program,
    "_env": _env,
    "_timeout": _of_type(int, 1),
    "_get_pty": _of_type(bool),
    "_temp_dir": _root_dir,
    "_chdir": _root_dir,
}


def pyinfra_key_problems(data: dict[str, Any], where: str) -> list[Problem]:
    """pyinfra's own keys (``ssh_*`` connection data, ``_*`` global arguments) pass through
    to pyinfra untyped, so a typo would silently fall back to a default (a mistyped
    ``ssh_hostnme`` connects to the host's name). Check names against pyinfra's lists and
    the values provision itself reads."""
    import difflib

    from pyinfra.api.arguments import all_argument_meta
    from pyinfra.connectors.ssh import connector_data_meta

    known = {*connector_data_meta, *all_argument_meta}
    problems = []
    for key, value in data.items():
        if not is_pyinfra_key(key):
            continue
        if key.startswith("winrm_"):
            problems.append(Problem(f"{where}: key {key_label(key)}", "provision connects over SSH only"))
        elif key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]}?" if close else "see pyinfra's connector and global arguments"
            problems.append(Problem(f"{where}: key {key_label(key)}", "unknown pyinfra key", hint))
        elif key not in PYINFRA_VALUE_CHECKS and key != "ssh_strict_host_key_checking":
            problems.append(
                Problem(
                    f"{where}: key {key}",
                    "an argument of single operations, not a host's setting",
                    "leave it out of the inventory",
                )
            )
        elif odd := v.plain_data(value):
            problems.append(Problem(f"{where}: key {key}", f"{v.brief(value)} {odd}"))
        elif key in PYINFRA_VALUE_CHECKS and (what := PYINFRA_VALUE_CHECKS[key](value)):
            problems.append(Problem(f"{where}: key {key}", what))
        elif key == "ssh_strict_host_key_checking" and value not in HOST_KEY_POLICIES:
            problems.append(
                Problem(
                    f"{where}: key {key}",
                    f"{value!r} is not one of {', '.join(HOST_KEY_POLICIES)}",
                    "'yes' (the default) refuses unknown and changed host keys",
                )
            )
    return problems
