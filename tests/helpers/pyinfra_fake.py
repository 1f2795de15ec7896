"""Run a provision Step against pyinfra's own ``@fake`` connector and record every
command it would have sent: facts answered from canned outputs, operations captured.

This is pyinfra's test means (``pyinfra.connectors.fake``), not a provision stand-in: the
real deploy code runs, through the real runner, and only the host is simulated.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyinfra.connectors.fake import FakeConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

from provision import engine
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings

# Facts pyinfra's own operations ask every Linux host for, and the one shell behaviour
# the fake must copy: engine.refuse()'s command fails.
BASELINE: dict[Any, Any] = {
    "uname -s": ["Linux"],
    "command -v useradd": ["/usr/sbin/useradd"],
    re.compile(r">&2; exit 1$"): {"success": False},
}


@dataclass
class FakeRun:
    """What one step did on fake hosts."""

    results: dict[str, engine.HostResult]  # per host, as `provision up` reports them
    commands: dict[str, list[str]] = field(default_factory=dict)  # host -> every command sent
    uploads: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> remote path -> text uploaded

    def ran(self, host: str, pattern: str) -> list[str]:
        """Commands sent to host that match a regular expression."""
        return [c for c in self.commands.get(host, []) if re.search(pattern, c)]


def fake_node(
    name: str, settings: Settings, responses: dict[Any, Any], groups: tuple[str, ...] = (), address: str | None = None
) -> Node:
    """A Node pyinfra reaches through the @fake connector, answering with ``responses``
    (substring or re.Pattern -> stdout lines, or {"stdout", "stderr", "success"})."""
    data = {"fake_responses": {**responses, **BASELINE}, "fake_delay": 0, "fake_delay_jitter": 0}
    ssh = SshTarget(address or name, 22, "root", None, None, "yes")
    return Node(f"@fake/{name}", ssh, groups, settings, data)


# pyinfra's FileContents fact: `( test -e PATH && cat PATH ) || echo <missing flag>`.
_READ_FILE = re.compile(r"^\( test -e (\S+) && cat \1 \) \|\| echo ")

Runner = Callable[[Cluster, list[engine.Step]], engine.RunReport]


def run_fake(
    step: engine.Step,
    nodes: list[Node],
    monkeypatch: Any,
    path: Path | None = None,
    runner: Runner | None = None,
) -> FakeRun:
    """Run one step through engine.run_steps (or ``runner``: the pipeline's wave, with its
    after_step) on fake hosts, recording commands and uploads. A file uploaded to a host
    reads back from it (FileContents) in a later pass of the same run. ``path``: the
    inventory file the cluster is loaded from, for a step that keeps state per inventory on
    the controller (the slurm step's munge key)."""
    commands: dict[str, list[str]] = {}
    uploads: dict[str, dict[str, str]] = {}
    original = FakeConnector.run_shell_command
    original_put = FakeConnector.put_file

    def recording(self: FakeConnector, command: Any, *args: Any, **kwargs: Any) -> Any:
        text = command if isinstance(command, str) else command.get_masked_value()
        commands.setdefault(self.host.name, []).append(text)
        read = _READ_FILE.match(text)
        uploaded = uploads.get(self.host.name, {})
        if read and read[1] in uploaded:
            return True, CommandOutput([OutputLine("stdout", line) for line in uploaded[read[1]].splitlines()])
        return original(self, command, *args, **kwargs)

    def uploading(self: FakeConnector, src: Any, dest: str, *args: Any, **kwargs: Any) -> Any:
        if isinstance(src, str):
            text = Path(src).read_text()
        else:  # read whole: pyinfra may have read it already (its sha1, for a file the host has)
            src.seek(0)
            text = src.read()
            src.seek(0)
        uploads.setdefault(self.host.name, {})[dest] = text.decode() if isinstance(text, bytes) else text
        return original_put(self, src, dest, *args, **kwargs)

    monkeypatch.setattr(FakeConnector, "run_shell_command", recording)
    monkeypatch.setattr(FakeConnector, "put_file", uploading)
    run = runner or engine.run_steps  # looked up now: a test may stand in for it
    report = run(Cluster(path=path, nodes=tuple(nodes)), [step])  # type: ignore[arg-type]
    return FakeRun(report.hosts, commands, uploads)
