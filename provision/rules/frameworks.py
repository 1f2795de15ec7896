"""Pure decisions of the frameworks step: the pinned requirements, the pip source, which pins a
wheelhouse lacks, and what a venv's pip freeze and the torch check say. The testbed's
wheelhouse downloads exactly these requirements."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from provision import controller_files
from provision.facts.venv import normalize
from provision.settings import Settings


def requirements(settings: Settings, wheel_names: Sequence[str] = ()) -> list[str]:
    """pip requirement strings: torch pinned, numpy and nvidia-ml-py pinned when asked,
    tensorboard (the trainer's event files) when its pin is set.

    A CPU or CUDA build from PyTorch's own index carries a local version label
    (2.13.0+cpu) and `pip freeze` reports it so; the pin takes the label from the
    wheelhouse's torch wheel, so a re-run sees the pin satisfied and installs nothing.
    """
    numpy = f"numpy=={settings.numpy_version}" if settings.numpy_version else "numpy"
    nvml = f"nvidia-ml-py=={settings.nvml_version}" if settings.nvml_version else "nvidia-ml-py"
    board = [f"tensorboard=={settings.tensorboard_version}"] if settings.tensorboard_version else []
    return [f"torch=={torch_version(settings.torch_version, wheel_names)}", numpy, nvml, *board]


def torch_version(pinned: str, wheel_names: Sequence[str]) -> str:
    """The pinned torch version, with the local label of a matching wheelhouse wheel."""
    for name in wheel_names:
        parts = name.split("-")
        if parts[0] == "torch" and len(parts) > 1 and parts[1].split("+")[0] == pinned:
            return parts[1]
    return pinned


def pip_source_args(settings: Settings) -> str:
    """Where pip looks (the uploaded wheelhouse only, or the index URL), whether it
    byte-compiles what it installs, and that it takes wheels only: a source distribution
    would run its setup code as root on the node. Every file is checked against its hash
    (``--require-hashes -r``): a wheelhouse's from its SHA256SUMS (hashed_requirements), an
    index's from the uploaded pip_lock_file; only ``pip_require_hashes = false`` without a
    lock installs an index's files unchecked."""
    args = ["--only-binary=:all:"] if settings.pip_compile else ["--only-binary=:all:", "--no-compile"]
    if settings.wheelhouse:
        args.append(f"--no-index --find-links {REMOTE_WHEELHOUSE} --require-hashes -r {REMOTE_REQUIREMENTS}")
        return " ".join(args)
    if settings.pip_index_url:
        args.append(f"--index-url {shlex.quote(settings.pip_index_url)}")
    if settings.pip_lock_file:
        args.append(f"--require-hashes -r {REMOTE_LOCK}")
    return " ".join(args)


def hashed(settings: Settings) -> bool:
    """pip installs a hashed requirements file whole (a wheelhouse's, or the lock)."""
    return bool(settings.wheelhouse or settings.pip_lock_file)


def wheel_files(directory: str) -> list[Path]:
    """The .whl files of a controller wheelhouse, sorted, or ValueError when there are none."""
    found = sorted(Path(directory).expanduser().glob("*.whl"))
    if not found:
        raise ValueError(f"wheelhouse {directory} holds no .whl files")
    return found


def wheelhouse_gaps(settings: Settings, wheel_names: Sequence[str]) -> list[str]:
    """The requirements that no wheel of a wheelhouse satisfies (pip would stop on the
    host with "No matching distribution"; this finds it on the controller, before any
    host is changed). A wheel's name and version are the first two fields of its file
    name (PEP 427). Only the name and version are checked, not the Python tag."""
    wheels = [name.split("-")[:2] for name in wheel_names if name.count("-") >= 4]
    return [
        req for req in requirements(settings, wheel_names) if all(missing([req], {normalize(n): v}) for n, v in wheels)
    ]


def missing(requirements: Sequence[str], installed: dict[str, str]) -> list[str]:
    """Requirements not satisfied: absent, or pinned to another version. As in PEP 440, a
    pin without a local label (2.13.0) is met by a local build of it (2.13.0+cpu)."""
    todo = []
    for req in requirements:
        name, _, version = req.partition("==")
        have = installed.get(normalize(name))
        if have is not None and "+" not in version:
            have = have.split("+")[0]
        if have is None or (version and have != version):
            todo.append(req)
    return todo


def torch_problem(output: str, version: str) -> str | None:
    """None when the check printed torch-ok with the pinned version, else why not."""
    for line in output.splitlines():
        if line.startswith("torch-ok"):
            got = line.split()[1] if len(line.split()) > 1 else "?"
            # A local version label (2.13.0+cpu) still pins the same release.
            if got.split("+")[0] != version:
                return f"torch {got} is installed, {version} is pinned"
            return None
    return output.strip().splitlines()[-1] if output.strip() else "python printed nothing"


REMOTE_WHEELHOUSE = "/opt/provision/wheelhouse"
REMOTE_LOCK = "/opt/provision/pip-lock.txt"  # pip_lock_file, uploaded
REMOTE_REQUIREMENTS = f"{REMOTE_WHEELHOUSE}/requirements.txt"  # hashed_requirements(), uploaded
SUMS_FILE = "SHA256SUMS"  # in a wheelhouse: `sha256sum *.whl` output, checked before any upload


# A file's SHA-256 by what identifies its content on this machine: path, device, inode,
# size, mtime and ctime (no user can set ctime back: any write to the file moves it). Each
# host's frameworks step checks the wheelhouse (sums_problem), and hashing 200 MB of wheels
# again per host made a converged `up` cost seconds of controller CPU per host.
_SHA256: dict[tuple[str, int, int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The file's SHA-256, read once while the file is unchanged."""
    import hashlib

    st = os.stat(path)
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _SHA256:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _SHA256[key] = digest.hexdigest()
    return _SHA256[key]


SUMS_MAX_BYTES = 2**20  # a line a wheel: thousands of wheels


def read_sums(directory: str) -> dict[str, str]:
    """wheel file name -> sha256 from the wheelhouse's SHA256SUMS (sha256sum's format)."""
    sums = {}
    text = controller_files.read_small_text(Path(directory).expanduser() / SUMS_FILE, SUMS_MAX_BYTES)
    for line in text.splitlines():
        digest, _, name = line.strip().partition(" ")
        if digest:
            sums[name.strip().lstrip("*")] = digest.lower()
    return sums


def sums_problem(directory: str) -> str | None:
    """Why the wheelhouse's wheels cannot be trusted, or None: every .whl must be listed in
    its SHA256SUMS with the hash it has now (a wheel swapped after the download is found
    here, on the controller, before it reaches any host)."""
    try:
        sums = read_sums(directory)
    except controller_files.Unreadable as e:
        return f"{e}; write {SUMS_FILE} where the wheels were downloaded: sha256sum *.whl"
    for wheel in wheel_files(directory):
        if not wheel.is_file():
            return f"{wheel} is not a regular file"
        want = sums.get(wheel.name)
        if want is None:
            return f"{wheel.name} is not listed in {directory}/{SUMS_FILE}"
        if file_sha256(wheel) != want:
            return f"{wheel.name} does not match its SHA-256 in {directory}/{SUMS_FILE}"
    return None


def hashed_requirements(directory: str) -> str:
    """pip's --require-hashes requirements for every wheel of the wheelhouse: one line per
    package version, with the hash of each of its wheels (from SHA256SUMS, checked by
    sums_problem), so pip installs only those exact files."""
    sums = read_sums(directory)
    pins: dict[str, list[str]] = {}
    for wheel in wheel_files(directory):
        name, version = wheel.name.split("-")[:2]
        pins.setdefault(f"{name}=={version}", []).append(sums[wheel.name])
    return "".join(f"{pin} {' '.join(f'--hash=sha256:{h}' for h in sorted(hs))}\n" for pin, hs in sorted(pins.items()))


def write_sums(directory: Path) -> None:
    """SHA256SUMS for the wheels of a wheelhouse this tool downloaded itself (the testbed)."""
    lines = [f"{file_sha256(w)}  {w.name}\n" for w in sorted(directory.glob("*.whl"))]
    (directory / SUMS_FILE).write_text("".join(lines))


# One requirement of a lock: a pinned name (extras allowed), an optional environment marker,
# and one or more sha256 hashes. Nothing else: a requirements file may also carry options
# (-r, -e, --index-url, --trusted-host...) that would widen what root's pip takes.
_LOCK_LINE = re.compile(
    r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9,._-]+\])?==(?P<version>[A-Za-z0-9.+!_-]+)"
    r"(\s*;\s*[A-Za-z0-9_ .*'\"<>=!~(),]+?)?(?P<hashes>(\s+--hash[= ]sha256:[0-9a-fA-F]{64})+)"
)


def parse_lock(text: str) -> tuple[dict[str, set[str]], list[str]]:
    """A pip lock (hash-checking requirements, as uv pip compile or pip-compile write them):
    package (normalised) -> pinned versions, and one problem per line that is not a pinned,
    hashed requirement. Comments and backslash continuations are understood."""
    pins: dict[str, set[str]] = {}
    problems = []
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    if pending:
        logical.append((start, pending))
    for number, line in logical:
        line = " ".join(line.split())
        if not line:
            continue
        match = _LOCK_LINE.fullmatch(line)
        if not match:
            problems.append(f"line {number}: {line[:80]!r} is not `name==version --hash=sha256:<64 hex>`")
            continue
        pins.setdefault(normalize(match["name"]), set()).add(match["version"])
    return pins, problems


def lock_problems(settings: Settings, text: str) -> list[str]:
    """Why a lock cannot serve these settings' pins: lines that are not pinned and hashed, a
    pinned package it lacks, or one it pins to another version."""
    pins, problems = parse_lock(text)
    if not pins and not problems:
        return ["it names no package"]
    for req in requirements(settings, _candidates(pins)):
        name, _, version = req.partition("==")
        have = pins.get(normalize(name), set())
        if not have:
            problems.append(f"it has no {name}")
        elif all(missing([req], {normalize(name): v}) for v in have):
            problems.append(f"it pins {name} {', '.join(sorted(have))}, the settings {version}")
    return problems


def lock_candidates(path: str) -> list[str]:
    """``name-version`` of every pin of a lock file, as requirements() takes wheel names."""
    pins, _ = parse_lock(Path(path).expanduser().read_text())
    return _candidates(pins)


def _candidates(pins: dict[str, set[str]]) -> list[str]:
    return [f"{name}-{version}" for name, versions in pins.items() for version in sorted(versions)]
