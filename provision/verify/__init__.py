"""`provision verify`: a pytest-testinfra suite shipped with the package, run against the
hosts of an inventory. It checks what the deploys promise (packages and versions, holds,
services, files, mounts), from the outside, over SSH.

The suite reads the expected state from a JSON spec the runner writes (per host: its
settings and whether the nvidia step applies), and reaches hosts through an OpenSSH
config generated from the inventory (provision.remote.ssh_config), so host keys stay
pinned exactly as for every other command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET  # parses only the reports our own pytest runs wrote
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.errors import ProvisionError
from provision.inventory import Cluster
from provision.remote import ssh_config

SUITE = Path(__file__).resolve().parent
SPEC_ENV = "PROVISION_VERIFY_SPEC"


@dataclass
class VerifyResult:
    """Outcome of one verify run."""

    exit_code: int  # pytest's: 0 all passed, 1 some failed, other: could not run
    junit_xml: str  # path of the JUnit report
    output: str  # pytest's terminal output


def spec(cluster: Cluster) -> dict[str, dict[str, object]]:
    """Per host: settings, groups and cluster address, for the suite's expectations."""
    return {
        n.name: {
            "settings": asdict(n.settings),
            "groups": list(n.groups),
            "cluster_address": n.cluster_address,
            "all_nodes": {m.name: m.cluster_address for m in cluster.all_nodes},
            "storage_node": _storage_name(cluster),
            "storage_export_root": _storage_export_root(cluster),  # what clients mount from
        }
        for n in cluster.nodes
    }


def _storage_name(cluster: Cluster) -> str | None:
    storage = cluster.storage_node()
    return storage.name if storage else None


def _storage_export_root(cluster: Cluster) -> str | None:
    storage = cluster.storage_node()
    return storage.settings.nfs_export_root if storage else None


PARALLEL_HOSTS = 16  # hosts checked at once, one pytest process each on the controller


def workdir_problem(workdir: Path) -> str | None:
    """Why verify may not write into ``workdir``, or None: it must be new, empty, or one an
    earlier verify wrote (its spec.json there). Anything else is someone's directory, whose
    ssh_config (/etc/ssh's, say) a run would overwrite."""
    if not workdir.exists():
        return None
    if not workdir.is_dir():
        return f"{workdir} is not a directory"
    if (workdir / "spec.json").is_file() or not any(workdir.iterdir()):
        return None
    return f"{workdir} holds files verify did not write (its ssh_config, spec.json and XML would overwrite theirs)"


def run(
    cluster: Cluster,
    workdir: str | None = None,
    extra: list[str] | None = None,
    timeout_s: int = 1800,
    parallel: int = PARALLEL_HOSTS,
) -> VerifyResult:
    """Run the suite against every host; returns the combined exit code and output.

    Each host gets its own pytest process, side by side (at most ``parallel`` at once) and
    under its own ``timeout_s``: hosts are checked in the time of the slowest instead of the
    sum (importing torch on a host is a minute and a half under the testbed's emulation), and
    a host that hangs is reported as timed out while every other host keeps its results.
    The hosts' JUnit reports are merged into one file."""
    import importlib.util

    if importlib.util.find_spec("testinfra") is None:  # a hand-trimmed install: say so, not "No module"
        raise ProvisionError(
            "provision verify needs pytest-testinfra on this controller: "
            "pip install 'pytest-testinfra>=10' (a normal install of provision brings it)"
        )
    work = Path(workdir or tempfile.mkdtemp(prefix="provision-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    # Sockets only this user can reach, on a path short enough for a socket (a workdir
    # given by the user may be long).
    control = Path(tempfile.mkdtemp(prefix="pv-", dir="/tmp"))
    config = work / "ssh_config"
    config.write_text(ssh_config(cluster.nodes) + shared_connections(control))
    (work / "spec.json").write_text(json.dumps(spec(cluster), default=str))
    names = [n.name for n in cluster.nodes]

    def one(name: str) -> tuple[int, str]:
        try:
            return _run_host(work, name, extra or [], timeout_s)
        finally:
            close_shared(config, name)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names)))) as pool:
            results = list(pool.map(one, names))
    finally:
        shutil.rmtree(control, ignore_errors=True)
    junit = work / "verify.xml"
    merge_junit([work / f"verify-{name}.xml" for name in names], junit)
    output = "".join(f"{HOST_HEADER}{name}\n{text}" for name, (_, text) in zip(names, results, strict=True))
    return VerifyResult(combined_exit_code([code for code, _ in results]), str(junit), output)


CONTROL_PERSIST_S = 60  # a shared connection left idle closes itself this long after its last use


def shared_connections(control_dir: Path) -> str:
    """An ssh_config block, after the hosts' own, by which every ssh to a host shares one
    connection through a control socket in ``control_dir``. pytest-testinfra starts an ssh
    per command, and each was a handshake and a login of its own: on a real fleet that is
    a login record per check, under the testbed's emulation seconds each. %C (a hash of
    user, host and port) keeps the socket path short; a directory path needs no quoting
    here (mkdtemp names it)."""
    return f"\nHost *\n  ControlMaster auto\n  ControlPath {control_dir}/%C\n  ControlPersist {CONTROL_PERSIST_S}\n"


def close_shared(config: Path, name: str) -> None:
    """Ask a host's shared connection to close now rather than linger for ControlPersist
    (also after a run killed at its deadline). None open is not an error."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(["ssh", "-F", str(config), "-O", "exit", name], capture_output=True, timeout=10, check=False)


def _run_host(work: Path, name: str, extra: list[str], timeout_s: int) -> tuple[int, str]:
    """One host's pytest run: (exit code, output); a run past ``timeout_s`` is killed and
    reported as pytest's "interrupted" (2) with the reason."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(SUITE),
        f"--hosts=ssh://{name}",
        f"--ssh-config={work / 'ssh_config'}",
        f"--junitxml={work / f'verify-{name}.xml'}",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--rootdir",
        str(SUITE),
        "-q",
        "-rfEs",
        *extra,
    ]
    env = os.environ | {SPEC_ENV: str(work / "spec.json")}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=work)
    except subprocess.TimeoutExpired as e:  # run() has killed it
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return INTERRUPTED, f"{partial}\nverify: {name} timed out after {timeout_s} s; its checks are incomplete\n"
    return done.returncode, done.stdout + done.stderr


HOST_HEADER = ">>> verify: "  # the line before each host's pytest output (pytest's own rules use = _ -)
INTERRUPTED = 2  # pytest's exit code for a run stopped before its end


def combined_exit_code(codes: list[int]) -> int:
    """0 when every host passed; a code other than 0 and 1 (could not run, interrupted)
    when any host has one, so "some checks failed" never hides "some hosts were not checked";
    otherwise 1."""
    odd = [c for c in codes if c not in (0, 1)]
    if odd:
        return max(odd)
    return 1 if 1 in codes else 0


def merge_junit(parts: list[Path], dest: Path) -> None:
    """One JUnit file holding every host's test suites (a host with no report adds none)."""
    root = ET.Element("testsuites")
    for part in parts:
        if not part.is_file():
            continue
        try:
            doc = ET.parse(part).getroot()
        except ET.ParseError:
            continue  # a run killed while writing it: its output says why
        root.extend(doc.iter("testsuite") if doc.tag == "testsuites" else [doc])
    ET.ElementTree(root).write(dest, encoding="utf-8", xml_declaration=True)
