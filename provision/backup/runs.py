"""The imperative commands behind `provision backup run|list|restore|check`, through
provision.remote: run a backup now, list snapshots, restore, check a restore against the live
files, and check repositories. Where things live and who backs up: provision.rules.backups.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from provision import values as v
from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node
from provision.rules.backups import UNIT, WRAPPER, backup_paths, repository

# --- imperative commands (provision backup ...), through provision.remote ---


@dataclass(frozen=True)
class Snapshot:
    """One restic snapshot, as `restic snapshots --json` reports it."""

    id: str  # full snapshot id
    short_id: str  # the 8-character id people type
    time: str  # when it was taken (RFC 3339)
    hostname: str  # the host it backed up
    paths: list[str]  # what it backed up
    tags: list[str]  # provision's snapshots carry the tag "provision"


def parse_snapshots(text: str) -> list[Snapshot]:
    """Parse `restic snapshots --json` output, oldest first."""
    entries = json.loads(text or "[]") or []
    return [
        Snapshot(
            e["id"],
            e.get("short_id", e["id"][:8]),
            e["time"],
            e.get("hostname", ""),
            list(e.get("paths", [])),
            list(e.get("tags") or []),
        )
        for e in entries
    ]


def not_created_yet(stderr: str) -> bool:
    """restic's own words for a repository with no config file, from 0.12 to 0.18: the
    backup script creates it on its first run, so listing before that is not a failure. Any
    other reason the config cannot be read (permissions, a wrong key, no route) is one."""
    return "Is there a repository at the following location?" in stderr and bool(
        re.search(r"unable to open config file: .*(does not exist|no such file)", stderr, re.IGNORECASE)
    )


def as_root(node: Node, command: str) -> str:
    """Commands that read root-only files run through sudo unless we log in as root."""
    from provision import remote

    return remote.as_root(node.ssh.user, command)


def run_command() -> str:
    """Back up now: the same unit the timer starts, so there is one code path."""
    return f"systemctl start {UNIT}"


def journal_command(lines: int = 20) -> str:
    return f"journalctl -u {UNIT} -n {lines} --no-pager -o cat"


def snapshots_command(hostname: str) -> str:
    return f"{WRAPPER} snapshots --json --tag provision --host {shlex.quote(hostname)}"


# A snapshot as restic names one: its id (8 hex digits or more, up to the full 64) or "latest".
_SNAPSHOT = re.compile(r"latest|[0-9a-f]{8,64}")


def restore_flag_problems(snapshot: str, target: str | None) -> list[Problem]:
    """--snapshot and --target, before any host: each reaches root's restic command line on
    the host, where "-t" would be an option and a relative target a path in root's home."""
    problems = []
    if not _SNAPSHOT.fullmatch(snapshot):
        problems.append(Problem("--snapshot", f"{snapshot!r} is not a snapshot id (hex, as `provision backup list` "
                                "shows it) or 'latest'"))  # fmt: skip
    if target is not None:
        why = v.absolute_path(target) or (
            "is / (restore over the live files with --in-place)" if target == "/" else None
        )
        if why:
            problems.append(Problem("--target", why, "name a new or empty directory, e.g. /data/restores/mine"))
    return problems


def restore_command(snapshot: str, target: str, hostname: str) -> str:
    """restic restore, verifying what it wrote. ``target`` "/" means in place. The host
    and tag filters pick "latest" among this host's snapshots in a shared repository."""
    return (
        f"{WRAPPER} restore {shlex.quote(snapshot)} --target {shlex.quote(target)} --verify "
        f"--host {shlex.quote(hostname)} --tag provision"
    )


# restic's own limits for --read-data-subset. Sizes ("5G") are left out: restic 0.12 on
# Ubuntu 22.04 does not know them, and the check would fail on the host instead of here.
_SUBSET_PART = re.compile(r"(\d+)/(\d+)")  # part n of t
_SUBSET_PERCENT = re.compile(r"(\d+(?:\.\d+)?)%")  # a random share of the packs
_SUBSET_MAX_PARTS = 256


def read_data_subset(value: str) -> str:
    """Validate restic check's --read-data-subset: "n/t" (1 <= n <= t <= 256) or "x%"
    (0 < x <= 100). Raises InputError, so bad input stops before any host is contacted."""
    where = f"--read-data-subset {value}"
    if part := _SUBSET_PART.fullmatch(value.strip()):
        if 1 <= int(part[1]) <= int(part[2]) <= _SUBSET_MAX_PARTS:
            return value.strip()
        raise InputError(Problem(where, f"n/t needs 1 <= n <= t <= {_SUBSET_MAX_PARTS}", "e.g. 1/5"))
    if percent := _SUBSET_PERCENT.fullmatch(value.strip()):
        if 0 < float(percent[1]) <= 100:
            return value.strip()
        raise InputError(Problem(where, "a percentage must be above 0% and at most 100%", "e.g. 10%"))
    raise InputError(
        Problem(where, "not a subset restic understands", "give a percentage such as 10% or a part n/t such as 1/5")
    )


def check_command(subset: str | None = None) -> str:
    """restic check of the host's repository; with a subset, that share of the data is also
    read back and verified (the structure check alone cannot see rotten pack files)."""
    command = f"{WRAPPER} check"
    return f"{command} --read-data-subset {shlex.quote(subset)}" if subset else command


def repository_checkers(nodes: list[Node], cluster: Cluster) -> dict[str, str]:
    """host -> the host that checks its repository: the first of the hosts that share one.
    restic check locks a repository exclusively, so checking it twice at once would fail."""
    first: dict[str, str] = {}
    return {n.name: first.setdefault(repository(n, cluster), n.name) for n in nodes}


def checksum_command(root: str) -> str:
    """sha256 of every file under root, paths relative to it, sorted."""
    q = shlex.quote(root)
    return f"cd {q} && find . -type f -print0 | sort -z | xargs -0r sha256sum"


def parse_checksums(text: str) -> dict[str, str]:
    """`sha256sum` lines -> {relative path: digest}."""
    out = {}
    for line in text.splitlines():
        digest, _, path = line.partition("  ")
        if path:
            out[path.removeprefix("./")] = digest
    return out


def compare(restored: dict[str, str], live: dict[str, str]) -> dict[str, Any]:
    """Restored files against the live ones: identical, different, missing from live."""
    same = sorted(p for p in restored if live.get(p) == restored[p])
    differ = sorted(p for p in restored if p in live and live[p] != restored[p])
    missing = sorted(p for p in restored if p not in live)
    return {"identical": len(same), "different": differ, "missing_live": missing}


@dataclass
class Outcome:
    """What one backup command did on one host."""

    host: str  # inventory name
    ok: bool  # the command did what was asked
    detail: str  # one line for people: the snapshot, the restored path, or why it failed
    seconds: float  # wall time on this host
    data: dict[str, Any]  # machine-readable details for --json (snapshots, restore target, check)


def _failed(node: Node, what: str, result: Any, seconds: float) -> Outcome:
    why = (result.stderr or result.stdout).strip().splitlines()[-3:] or [f"exit {result.exited}"]
    return Outcome(node.name, False, f"{what}: {' / '.join(why)}", seconds, {})


def run_now(node: Node, timeout_s: float = 3600) -> Outcome:
    """Start the backup unit and wait for it; the journal tells why when it fails."""
    import time

    from provision import remote

    start = time.monotonic()
    result = remote.run(node, as_root(node, run_command()), timeout=timeout_s)
    if not result.ok:
        journal = remote.run(node, as_root(node, journal_command()), timeout=60)
        if journal.ok and journal.stdout.strip():
            result = journal.__class__(node.name, result.exited, "", journal.stdout)
        return _failed(node, "backup failed", result, time.monotonic() - start)
    snaps = list_snapshots(node)
    latest = snaps.data.get("snapshots", [])[-1:] if snaps.ok else []
    detail = f"snapshot {latest[0]['short_id']}" if latest else "backed up"
    return Outcome(node.name, True, detail, time.monotonic() - start, {"snapshot": latest[0] if latest else None})


def list_snapshots(node: Node) -> Outcome:
    import time
    from dataclasses import asdict

    from provision import remote

    start = time.monotonic()
    result = remote.run(node, as_root(node, snapshots_command(node.name)), timeout=300)
    if not result.ok and not_created_yet(result.stderr):
        return Outcome(
            node.name,
            True,
            "no repository yet: the first backup run creates it",
            time.monotonic() - start,
            {"snapshots": [], "repository": "not created yet"},
        )
    if not result.ok:
        return _failed(node, "listing snapshots failed", result, time.monotonic() - start)
    try:
        snaps = parse_snapshots(result.stdout)
    except (json.JSONDecodeError, KeyError) as e:
        return Outcome(node.name, False, f"unreadable restic output: {e}", time.monotonic() - start, {})
    return Outcome(
        node.name,
        True,
        f"{len(snaps)} snapshot(s)",
        time.monotonic() - start,
        {"snapshots": [asdict(s) for s in snaps]},
    )


def _target_problem(node: Node, target: str) -> str | None:
    """A restore target must be new or empty: restoring never overwrites silently."""
    from provision import remote

    probe = remote.run(
        node, as_root(node, f'test ! -e {shlex.quote(target)} || test -z "$(ls -A {shlex.quote(target)})"'), timeout=60
    )
    if probe.exited == 1:
        return f"{target} exists and is not empty; choose a new --target, or --in-place to overwrite live data"
    return None if probe.ok else f"cannot check {target}: {probe.stderr.strip()}"


def restore(
    node: Node, snapshot: str, target: str | None, in_place: bool, stamp: str, timeout_s: float = 3600
) -> Outcome:
    """Restore a snapshot to target (default: a new directory on the data volume), or in
    place over the live paths when asked explicitly."""
    import time

    from provision import remote

    start = time.monotonic()
    where = "/" if in_place else (target or f"{node.settings.data_mount}/restores/{stamp}")
    if not in_place:
        problem = _target_problem(node, where)
        if problem:
            return Outcome(node.name, False, problem, 0.0, {})
    result = remote.run(node, as_root(node, restore_command(snapshot, where, node.name)), timeout=timeout_s)
    if not result.ok:
        return _failed(node, "restore failed", result, time.monotonic() - start)
    restored = [f"{where.rstrip('/')}{p}" for p in backup_paths(node)]
    return Outcome(
        node.name,
        True,
        f"restored {snapshot} to {where}",
        time.monotonic() - start,
        {"snapshot": snapshot, "target": where, "paths": restored},
    )


def check_verdict(report: dict[str, Any]) -> tuple[bool, str]:
    """Pass only when files were compared and all matched: a check that compared nothing
    (an empty snapshot) proves nothing, so it is not a pass."""
    if report["different"] or report["missing_live"]:
        return False, f"{len(report['different'])} differ, {len(report['missing_live'])} missing from live data"
    if report["identical"] == 0:
        return False, "the snapshot holds no files: nothing was checked"
    return True, f"{report['identical']} file(s) restored identical to live"


def check(node: Node, snapshot: str, stamp: str) -> Outcome:
    """Restore into a scratch directory, compare every file's sha256 with the live file,
    then remove the scratch directory."""
    import time

    from provision import remote

    start = time.monotonic()
    scratch = f"{node.settings.data_mount}/restores/check-{stamp}"
    restored = restore(node, snapshot, scratch, False, stamp)
    if not restored.ok:
        return restored
    report: dict[str, Any] = {"identical": 0, "different": [], "missing_live": []}
    try:
        for path in backup_paths(node):
            copy = remote.run(node, as_root(node, checksum_command(f"{scratch}{path}")), timeout=3600)
            live = remote.run(node, as_root(node, checksum_command(path)), timeout=3600)
            if not (copy.ok and live.ok):
                return _failed(node, "checksums failed", copy if not copy.ok else live, time.monotonic() - start)
            one = compare(parse_checksums(copy.stdout), parse_checksums(live.stdout))
            report["identical"] += one["identical"]
            report["different"] += [f"{path}/{p}" for p in one["different"]]
            report["missing_live"] += [f"{path}/{p}" for p in one["missing_live"]]
    finally:
        remote.run(node, as_root(node, f"rm -rf --one-file-system {shlex.quote(scratch)}"), timeout=600)
    ok, detail = check_verdict(report)
    return Outcome(node.name, ok, detail, time.monotonic() - start, {"snapshot": snapshot, "check": report})


CHECK_TIMEOUT_S = 6 * 3600  # reading data back over SFTP takes hours on a big repository


def check_repository(node: Node, subset: str | None = None, timeout_s: float = CHECK_TIMEOUT_S) -> Outcome:
    """restic check on this host's repository: passes only when restic exits 0."""
    import time

    from provision import remote

    start = time.monotonic()
    result = remote.run(node, as_root(node, check_command(subset)), timeout=timeout_s)
    if not result.ok:
        return _failed(node, "check failed", result, time.monotonic() - start)
    read = f", {subset} of the data read back" if subset else ""
    return Outcome(node.name, True, f"no errors found{read}", time.monotonic() - start, {"read_data_subset": subset})


def shared_outcomes(checkers: dict[str, str], checked: dict[str, Outcome]) -> dict[str, Outcome]:
    """Every host's result: its own check, or the check of the repository it shares."""
    out = {}
    for name, by in checkers.items():
        own = checked[by]
        out[name] = (
            own
            if by == name
            else Outcome(name, own.ok, f"same repository as {by}: {own.detail}", 0.0, {**own.data, "checked_by": by})
        )
    return out
