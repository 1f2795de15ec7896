"""The run context: what one run of steps shares with the deploys it runs.

pyinfra hands a deploy one host at a time and no arguments, so the engine puts one
RunContext into every host's data (beside the host's typed Node) for the length of a run.
Deploys reach it through the functions here; nothing is kept in module globals, so two
runs (a plan inside a test, say) never see each other's notes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Any, cast

from provision.inventory import Cluster, Node

NODE_KEY = "provision_node"  # host data key under which deploys find their typed Node
RUN_KEY = "provision_run"  # host data key under which deploys find the RunContext


@dataclass
class RunContext:
    """One run of steps (`up` or `plan`) as the deploys see it."""

    cluster: Cluster | None  # the whole inventory, for deploys that write about every node (/etc/hosts);
    # None for a pass outside `up` and `plan` (the reboot step a run adds, tests)
    step_names: tuple[str, ...]  # the steps of this run (preflight checks disks only if volumes runs)
    # A plan: nothing earlier steps would do has happened (a later step's facts are the
    # host's as it is now, e.g. no NVIDIA repository yet for the monitoring step's DCGM).
    planning: bool = False
    notes: dict[str, list[str]] = field(default_factory=dict)  # host -> notes for its summary row
    skips: dict[str, set[str]] = field(default_factory=dict)  # host -> steps that found nothing to do
    refusals: dict[str, list[str]] = field(default_factory=dict)  # host -> reasons a deploy refused it
    secret_uploads: set[str] = field(default_factory=set)  # remote paths a plan never shows (keys)

    def take_notes(self, name: str) -> list[str]:
        return self.notes.pop(name, [])

    def take_refusals(self, name: str) -> list[str]:
        return self.refusals.pop(name, [])

    def take_skips(self, name: str) -> set[str]:
        return self.skips.pop(name, set())


def _host() -> Any:
    from pyinfra import host

    return host


def current_run() -> RunContext:
    """Inside a deploy run by the engine: the run's context."""
    run = _host().data.get(RUN_KEY)
    if run is None:
        raise RuntimeError("current_run() called outside a run of the engine (run_steps/plan_steps)")
    return cast(RunContext, run)


def current_node() -> Node:
    """Inside a deploy: the typed Node of the host pyinfra is working on."""
    return cast(Node, _host().data.get(NODE_KEY))


def current_cluster() -> Cluster:
    """Inside a deploy: the full Cluster, all nodes."""
    cluster = current_run().cluster
    if cluster is None:
        raise RuntimeError("current_cluster() called in a pass that was given no cluster")
    return cluster


def current_steps() -> tuple[str, ...]:
    """Inside a deploy: the names of the steps in this run."""
    return current_run().step_names


def note(text: str) -> None:
    """Inside a deploy: leave a note for the current host's summary row."""
    current_run().notes.setdefault(_host().name, []).append(text)


def skip(step: str, reason: str) -> None:
    """Inside a deploy: this step does not apply to the current host after all (a fact only
    the host knows, such as no NVIDIA GPU); the summary notes why and the step is not counted
    as run there."""
    note(f"{step}: skipped ({reason})")
    current_run().skips.setdefault(_host().name, set()).add(step)


def secret_upload(dest: str) -> str:
    """Inside a deploy: mark an upload's destination as secret, so `provision plan` shows
    no diff of it. Returns dest, to wrap the argument: files.put(dest=secret_upload(p))."""
    current_run().secret_uploads.add(dest)
    return dest


# The SSH user's own directory for uploads that go through a temporary file (with _sudo):
# relative, so it is in that user's home for SFTP and for the `cp` that follows (both start
# there), and mode 0700, so no one else can read what passes through it.
UPLOAD_DIR = ".provision-upload"


def put_secret(
    name: str, src: str | IO[str], dest: str, user: str, group: str, mode: str = "600", owns_dir: bool = True
) -> Any:
    """Inside a deploy: upload a secret (a private key, a password; ``src`` a controller file
    or the text itself, in a StringIO) so that no other user can read it at any moment, and
    `provision plan` shows no diff of it.

    pyinfra's files.put writes through ``/tmp/pyinfra-<sha1 of dest>`` with the default
    mode when ``_sudo`` is used, and creates ``dest`` with that mode before its chmod. Here
    ``dest`` exists first, empty, with mode 0600 and its owner (the upload then only
    replaces its content: neither SFTP nor ``cp`` changes an existing file's mode), and the
    temporary file lives in the SSH user's 0700 UPLOAD_DIR. ``mode`` is the owner's alone
    (600, or 400 for a key its daemon only reads). ``owns_dir``: the file's directory is
    made and given to ``user`` too (pyinfra's default: /etc/munge is munge's); False for a
    file in a directory that exists and is someone else's (slurmdbd.conf in root's /etc/slurm)."""
    from pyinfra.operations import files

    secret_upload(dest)
    files.directory(name=f"{name}: private upload directory", path=UPLOAD_DIR, mode="700", _sudo=False)
    owner: dict[str, Any] = {"user": user, "group": group, "mode": mode, "create_remote_dir": owns_dir}
    files.file(name=f"{name}: 0{mode} before any content", path=dest, **owner)
    return files.put(name=name, src=src, dest=dest, _temp_dir=UPLOAD_DIR, **owner)


def refuse(step: str, reason: str) -> None:
    """Inside a deploy: fail the current host with a reason people can read.

    Adds an operation that prints the reason to stderr and exits 1, which the summary
    shows as "<step>: <step> checks: <reason>"; a plan reports it as "would stop".
    """
    import shlex

    from pyinfra.operations import server

    current_run().refusals.setdefault(_host().name, []).append(reason)
    server.shell(name=f"{step} checks", commands=[f"echo {shlex.quote(reason)} >&2; exit 1"])
