"""What an inventory value may be: the checks behind each setting's type.

Every value of the inventory is input from a person (or a script) and ends up in root
shells, fstab, exports, unit files and ssh_config on the nodes and the controller. Each
check here says what a kind of value is (an absolute path, a host name, a user name...)
and returns why a value is not that, or None. Allow-lists, not deny-lists: a value of a
kind holds only the characters that kind needs, so no shell, fstab or ssh_config
metacharacter (``$``, ``;``, space, newline, quote...) ever reaches a file or command,
whatever quoting a builder does on top.
"""

from __future__ import annotations

import ipaddress
import math
import posixpath
import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], "str | None"]

# Characters of a path that needs no quoting anywhere it goes (fstab, exports, unit files).
_PATH = re.compile(r"/[A-Za-z0-9._+@:/-]*")
# Trees the system owns: a data directory here would be mounted over, chown'ed or exported.
# The one list: every path knob (data_mount, the NFS roots, venv_path, train_dir) is checked
# against it by data_directory.
_SYSTEM_TREES: tuple[str, ...] = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/root",
)
_SYSTEM_TREES += ("/run", "/sbin", "/sys", "/usr")
# People's homes: their own (a volume mounted over one hides its authorized_keys; a venv
# or train_dir there is the user's to change, and root would run it).
_SYSTEM_TREES += ("/home",)
# Directories that may hold a data directory but must not be one.
_SYSTEM_DIRS = {"/", "/media", "/mnt", "/opt", "/snap", "/srv", "/tmp", "/var"}
_SYSTEM_DIRS |= {f"/var/{d}" for d in ("backups", "cache", "lib", "local", "lock", "log", "mail", "opt", "run")}
_SYSTEM_DIRS |= {"/var/spool", "/var/tmp"}
# Trees under those that packages and the system keep their own state in: a data volume
# mounted over dpkg's database or the journal hides what was there.
_SYSTEM_TREES += tuple(f"/var/lib/{d}" for d in ("apt", "dpkg", "systemd", "nfs", "ucf", "pam", "sudo"))
_SYSTEM_TREES += ("/var/log/journal", "/var/cache/apt", "/var/cache/debconf")
# Pseudo filesystems: nothing there is a file to back up.
_PSEUDO_TREES = ("/dev", "/proc", "/run", "/sys")


def brief(value: Any, limit: int = 80) -> str:
    """Any value as a message prints it: its repr, cut to ``limit`` characters, and never an
    error. A value that is not plain data reads as its type: an object's repr is its code's
    (it may raise, or exit), and an int of 5,000 digits has none."""
    if plain_data(value) is not None:
        return f"<a {type(value).__name__}>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_data(value: Any, depth: int = 0) -> str | None:
    """Why ``value`` is not plain data (str, int, float, bool, None, and lists, tuples and
    dicts of them), or None. A subclass of str is refused: every check here reads the
    value, but a file or command is written from its str() or format(), which a subclass
    may make say anything (a line of its own). Ints are 64-bit at most."""
    kind = type(value)
    if depth > 20:
        return "nests too deep"
    if kind is str:
        return None if len(value) <= 4096 else "is longer than 4096 characters"
    if kind in (bool, type(None)):
        return None
    if kind is int:
        return None if -(2**63) <= value < 2**63 else "is an integer too large for any setting"
    if kind is float:
        return None
    if kind in (list, tuple):
        return next((p for p in (plain_data(x, depth + 1) for x in value) if p), None)
    if kind is dict:
        items = (plain_data(x, depth + 1) for pair in value.items() for x in pair)
        return next((p for p in items if p), None)
    return f"is a {kind.__name__}, not plain data (a string, number, bool, list or dict)"


def host_label(name: str) -> str:
    """A host's name as problems print it: as written when it is a host name, else
    escaped (a newline or an escape sequence in a name must not reach the terminal raw)."""
    return name if address(name) is None else ascii(name)


def shown(text: str) -> str:
    """A value as a message prints it: as written when printable, else escaped (a newline or
    an escape sequence from an input file must not reach the terminal raw)."""
    return text if text.isprintable() else ascii(text)


def inside(path: str, tree: str) -> bool:
    """Is ``path`` the directory ``tree`` or under it (both absolute and normalised)?"""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def overlap(a: str, b: str) -> bool:
    """Is either directory the other or under it?"""
    return inside(a, b) or inside(b, a)


def _under(path: str, trees: tuple[str, ...]) -> bool:
    return any(inside(path, t) for t in trees)


def absolute_path(value: Any) -> str | None:
    """An absolute path, normalised, of letters, digits and ``._+@:-/`` only."""
    if not isinstance(value, str) or not _PATH.fullmatch(value):
        return f"{value!r} is not an absolute path of letters, digits and ._+@:- (no spaces or shell characters)"
    if posixpath.normpath(value) != value or "//" in value or "/../" in f"{value}/":
        return f"{value!r} is not a normalised absolute path (no '..', '//', '.' or trailing '/')"
    return None


def data_directory(value: Any) -> str | None:
    """An absolute path where provision keeps data: never / or a system directory."""
    problem = absolute_path(value)
    if problem:
        return problem
    if value in _SYSTEM_DIRS or _under(value, _SYSTEM_TREES):
        return f"{value!r} is / or a system directory; use a directory of its own (e.g. under /srv or /opt)"
    return None


def source_path(value: Any) -> str | None:
    """A path to back up: any real directory but / and the pseudo filesystems."""
    problem = absolute_path(value)
    if problem:
        return problem
    if value == "/" or _under(value, _PSEUDO_TREES):
        return f"{value!r} is / or a pseudo filesystem; name the directories to back up"
    return None


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def controller_path(value: Any) -> str | None:
    """A path on the controller (~ allowed): opened here, never sent to a shell."""
    if not isinstance(value, str) or not value.strip() or _CONTROL.search(value) or '"' in value:
        return f"{value!r} is not a file path (empty, or holds a control character or a double quote)"
    return None


_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def host_name(value: Any) -> str | None:
    """An RFC 1123 host name: dot-separated labels of ASCII letters, digits and '-'."""
    if isinstance(value, str) and len(value) <= 253 and all(_LABEL.fullmatch(p) for p in value.split(".")):
        return None
    return f"{value!r} is not an RFC 1123 host name (ASCII letters, digits, '-' and '.')"


def _reads_as_ipv4(value: str) -> bool:
    # glibc's resolver takes inet_aton's forms before it reads /etc/hosts: "0x7f000001" is
    # 127.0.0.1, "1.0x1" is 1.0.0.1, "123" is 0.0.0.123.
    import socket

    if not value.isascii() or not value.isprintable():  # inet_aton raises on NUL, not OSError
        return False
    try:
        socket.inet_aton(value)
    except OSError:
        return False
    return True


def node_name(value: Any) -> str | None:
    """An inventory host's name: an RFC 1123 host name that names one machine. It goes into
    every node's /etc/hosts and Slurm's NodeName, so not an address ("10.0.0.1", "123" and
    "0x7f000001" read as one) and not localhost."""
    problem = host_name(value)
    if problem:
        return problem
    if value.rsplit(".", 1)[-1].isdigit() or _reads_as_ipv4(value):
        return f"{value!r} reads as an IP address; name hosts by host name (the address goes in ssh_hostname)"
    if value.lower() == "localhost" or value.lower().startswith("localhost."):
        return f"{value!r} names the local machine on every host; give each host its own name"
    return None


def _zone_or_space(value: str) -> str | None:
    # Python's ipaddress takes an IPv6 zone ("fe80::1%eth0") holding any character at all,
    # spaces and newlines included: written into /etc/hosts, chrony's sources or exports, such
    # a value adds lines of its own. Neither a zone nor whitespace belongs in a cluster file.
    if "%" in value:
        return f"{value!r}: an IPv6 zone (%...) is not accepted; give the address alone"
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        return f"{value!a} holds a space, a control character or a non-ASCII character"
    return None


def ip_address(value: Any) -> str | None:
    """An IP address written as text (an int or a bool is not one, though Python takes both)."""
    if not isinstance(value, str):
        return f"{value!r} is not an IP address (a string such as '10.0.0.1')"
    problem = _zone_or_space(value)
    if problem:
        return problem
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address"
    return None


def is_ip(value: Any) -> bool:
    """Is ``value`` an IP address as ip_address takes one (a DNS name is not)?"""
    return ip_address(value) is None


def host_ip(value: Any) -> str | None:
    """An IP address one host can have: not unspecified (0.0.0.0, ::), multicast or
    reserved. (Loopback stays: hosts in one machine's network namespaces, as the tests
    run them, talk over 127.0.0.0/8.)"""
    problem = ip_address(value)
    if problem:
        return problem
    ip = ipaddress.ip_address(value)
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return f"{value!r} is not a host's address (unspecified, multicast or reserved)"
    return None


def _looks_like_ip(value: Any) -> bool:
    # A host name has no ':', its last label is not all digits, and the resolver does not
    # read it as an IPv4 address ("0x7f000001"): anything else is meant as an address, and
    # is told what is wrong with it as one (only the dotted-quad form is one).
    return not isinstance(value, str) or ":" in value or value.rsplit(".", 1)[-1].isdigit() or _reads_as_ipv4(value)


def address(value: Any) -> str | None:
    """An IP address or an RFC 1123 host name."""
    return ip_address(value) if _looks_like_ip(value) else host_name(value)


def server_address(value: Any) -> str | None:
    """A server to reach: a host name, or an IP address a host can have."""
    return host_ip(value) if _looks_like_ip(value) else host_name(value)


_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def user_name(value: Any) -> str | None:
    """A POSIX portable user or group name (at most 32 characters, no leading '-')."""
    if isinstance(value, str) and _USER.fullmatch(value):
        return None
    return f"{value!r} is not a POSIX user name (letters, digits, '_', '.', '-'; up to 32)"


# Accounts of the system and of the packages provision installs: a training user by one of
# these names would own what that service trusts (munge's key forges any uid's Slurm
# credential, slurm is SlurmUser, prometheus owns the metrics the drain rules read).
_SERVICE_ACCOUNTS = {"root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy"}
_SERVICE_ACCOUNTS |= {"www-data", "backup", "list", "irc", "gnats", "sshd", "messagebus", "syslog"}
_SERVICE_ACCOUNTS |= {"_apt", "systemd-network", "systemd-resolve", "systemd-timesync", "polkitd", "chrony", "_chrony"}
_SERVICE_ACCOUNTS |= {"statd", "_rpc", "munge", "slurm", "mysql", "prometheus", "nvidia-dcgm", "nvidia-persistenced"}


def unprivileged_user(value: Any) -> str | None:
    """A POSIX user name for an account that must not be root or a service's account (nor
    provision's backup accounts, provision-backup-*)."""
    problem = user_name(value)
    if problem is None and (value in _SERVICE_ACCOUNTS or value.startswith("provision-")):
        what = "root" if value == "root" else "a system or service account"
        return f"{value!r} is {what}, not an unprivileged account; name the account training runs as, e.g. train"
    return problem


def interface(value: Any) -> str | None:
    """A Linux network interface name (at most 15 characters, no '/' or space)."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", value) and value not in (".", ".."):
        return None
    return f"{value!r} is not a network interface name such as eth1 (up to 15 letters, digits, _ . -)"


def cidr(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not a network in CIDR form, e.g. 10.0.0.0/24"
    problem = _zone_or_space(value)
    if problem:
        return problem
    try:
        ipaddress.ip_network(value, strict=False)
    except (ValueError, TypeError):
        return f"{value!r} is not a network in CIDR form, e.g. 10.0.0.0/24"
    return None


# Narrowest prefix still taken as one cluster network: wider means "everyone" to NFS.
WIDEST_PREFIX = {4: 8, 6: 32}


def cluster_network(value: Any) -> str | None:
    """A CIDR narrow enough to be a cluster network: NFS exports go to all of it."""
    problem = cidr(value)
    if problem:
        return problem
    net = ipaddress.ip_network(value, strict=False)
    if net.prefixlen < WIDEST_PREFIX[net.version]:
        return f"{value!r} is wider than /{WIDEST_PREFIX[net.version]}: NFS would export to far more than the cluster"
    return None


def bounded(low: float, high: float) -> Check:
    """A number from low to high, finite (no NaN or infinity)."""

    def check(value: Any) -> str | None:
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value!r} is not a finite number"
        return None if low <= value <= high else f"{value!r} is not between {low} and {high}"

    return check


def finite_numbers(value: dict[str, Any]) -> str | None:
    bad = [k for k, v in value.items() if isinstance(v, float) and not math.isfinite(v)]
    return f"{', '.join(bad)}: not a finite number" if bad else None


def url(value: Any) -> str | None:
    """An http(s) or file URL with no space, quote or shell character ({distro} allowed)."""
    if isinstance(value, str) and re.fullmatch(r"(https?://[A-Za-z0-9]|file:///)[A-Za-z0-9._~:/?#@!%+=,{}-]*", value):
        return None
    return f"{value!r} is not an http(s):// or file:/// URL without spaces, quotes or shell characters"


def restic_repository(value: Any) -> str | None:
    """A restic repository spec: an absolute path or backend:location ({host} allowed)."""
    spec = re.compile(r"(/|(local|sftp|rest|s3|b2|azure|gs|swift|rclone):)[A-Za-z0-9._~:/@%+=,{}-]*")
    if isinstance(value, str) and spec.fullmatch(value):
        backend, colon, location = value.partition(":") if not value.startswith("/") else ("", "", value)
        if colon and (not location or location.startswith("-")):
            # restic hands sftp's host to ssh as an argument: "-o..." would be an ssh option
            return f"{value!r}: the location after {backend}: is empty or starts with '-'"
        path = location if backend in ("", "local") else ""
        if path and (problem := data_directory(path.replace("{host}", "host"))):
            return f"backup repository {problem}"
        return None
    return (
        f"{value!r} is not a restic repository (an absolute path, or sftp:, rest:, s3:, b2:, azure:, gs:, "
        "swift:, rclone: followed by letters, digits and ._~:/@%+=,-)"
    )


def calendar(value: Any) -> str | None:
    """A systemd OnCalendar expression: its own characters only, one line."""
    if isinstance(value, str) and 0 < len(value) <= 100 and re.fullmatch(r"[A-Za-z0-9*:,./~ +-]+", value):
        if value.startswith("-"):  # no calendar expression does; to a command it is an option
            return f"{value!r} starts with '-'; give a systemd OnCalendar expression such as daily"
        return None if value.strip() == value else f"{value!r} starts or ends with a space"
    return f"{value!r} is not a systemd OnCalendar expression such as daily or *-*-* 02:00:00"


def slurm_name(value: Any) -> str | None:
    """A Slurm cluster or partition name: lower-case letters, digits, _ and -, at most 40
    (ClusterName is lower-cased by Slurm and names accounting tables)."""
    if isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", value):
        return None
    return f"{value!r} is not a Slurm name (a lower-case letter, then a-z, 0-9, _ or -; 40 at most)"


def slurm_time(value: Any) -> str | None:
    """A Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, or UNLIMITED."""
    pattern = r"UNLIMITED|\d{1,6}|\d{1,6}:\d{2}|\d{1,6}:\d{2}:\d{2}|\d{1,4}-\d{1,2}(:\d{2}(:\d{2})?)?"
    if isinstance(value, str) and re.fullmatch(pattern, value, re.ASCII):  # ASCII: \d is any script's digits
        return None
    return f"{value!r} is not a Slurm time such as 60, 01:00:00, 2-00:00:00 or UNLIMITED"


def share_name(value: Any) -> str | None:
    """A share: one directory name (no '/', not '.' or '..')."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}", value):
        return None
    return f"{value!r} is not a directory name (letters, digits, ._-; no '/' or '..')"


_EXPORT_FLAGS = {"rw", "ro", "sync", "async", "root_squash", "all_squash", "secure", "insecure"}
_EXPORT_FLAGS |= {"subtree_check", "no_subtree_check", "wdelay", "no_wdelay", "hide", "nohide", "crossmnt"}
_EXPORT_FLAGS |= {"secure_locks", "insecure_locks", "no_acl", "mp"}
_EXPORT_OPPOSITES: tuple[tuple[str, str], ...] = (
    ("rw", "ro"),
    ("sync", "async"),
    ("secure", "insecure"),
    ("hide", "nohide"),
)
_EXPORT_OPPOSITES += (("subtree_check", "no_subtree_check"), ("wdelay", "no_wdelay"))
_EXPORT_OPPOSITES += (("secure_locks", "insecure_locks"),)
# No fsid=: the one option string goes on every share's line, and shares with one fsid are
# one filesystem to the clients (their file handles collide).
_EXPORT_VALUED = re.compile(r"(anonuid|anongid)=[0-9]{1,10}|sec=(sys|krb5|krb5i|krb5p)(:(sys|krb5|krb5i|krb5p))*")


def export_options(value: Any) -> str | None:
    """exports(5) options for the one client (the cluster network): a whitelist of tokens.
    no_root_squash (root on any node would be root on the share) is not one of them."""
    if not isinstance(value, str) or not value:
        return f"{value!r} is not a comma-separated list of exports(5) options"
    # The squashed users become anonuid/anongid: 0 makes every client's root, or with
    # all_squash every client user, root on the share: no_root_squash by another name.
    # Below 1000 are system accounts and groups (disk, adm, sudo...): files a squashed
    # client leaves are theirs on the server, setuid or setgid ones included.
    low = [t for t in value.split(",") if re.fullmatch(r"anon[ug]id=[0-9]+", t) and int(t.split("=")[1]) < 1000]
    if low:
        return (
            f"{', '.join(low)} maps squashed users to root or a system account on the share; "
            "give an unprivileged id (1000 or more, e.g. 65534)"
        )
    tokens = value.split(",")
    bad = [t for t in tokens if t not in _EXPORT_FLAGS and not _EXPORT_VALUED.fullmatch(t)]
    if bad:
        return (
            f"{', '.join(repr(t) for t in bad)} not allowed; options: {', '.join(sorted(_EXPORT_FLAGS))}, anonuid=N..."
        )
    # exportfs keeps one of two opposites without a word: the export is not what was asked.
    both = [f"{a} and {b}" for a, b in _EXPORT_OPPOSITES if a in tokens and b in tokens]
    if both:
        return f"{'; '.join(both)} contradict each other; keep one"
    return None


def exporter_collector(value: Any) -> str | None:
    """A node exporter collector's name (cpu, meminfo, netdev...): it becomes --collector.NAME."""
    if isinstance(value, str) and re.fullmatch(r"[a-z][a-z0-9_]{0,39}", value):
        return None
    return f"{value!r} is not a node exporter collector name (lower-case letters, digits and _)"


def disk_name(value: Any) -> str | None:
    """A disk serial or /dev/disk/by-id path: no space, quote or shell character."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9._:+@/-]+", value):
        return None
    return f"{value!r} holds a character no disk id has (letters, digits and ._:+@-/ only)"


def each(check: Check) -> Check:
    """The check of a list: every item, first failure said."""

    def check_all(value: list[Any]) -> str | None:
        return next((p for p in (check(v) for v in value) if p), None)

    return check_all


def optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)
