"""Record the converged-host profile of the fleet stand-in: run `provision plan` and `provision
up` (every step) against a testbed that is already provisioned, through pyinfra's own ssh
connector, and store every command one compute node (not the storage host) was sent, exactly
as sent, with its exit code and output.

    .venv/bin/python -m tests.standins.fleet_profiles.capture_up INVENTORY [HOST]

A simulated host is a copy of that node under another name, so what names the node is stored
as a placeholder, and nothing else is edited:
- ``{{name}}`` for its name and ``{{address}}`` for its cluster address, in commands and
  output (its /dev/disk/by-id names, its host key's comment, its hostname);
- ``{{cluster_hosts_block}}``, one line standing for the /etc/hosts lines that list every
  node of the cluster (a converged host of a simulated fleet lists that fleet's nodes), with
  the line's form learned from the captured block (``{{line}}``);
- another node's name in an answer (an NFS mount in mountinfo) is left as captured;
- the inventory data of the node (``host_data``), with the same placeholders, so the
  simulated inventory asks for what the captured one did (its data disks, its wheelhouse).

Refuses to write a profile unless both runs changed nothing: it must be a converged host.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from provision import inventory
from provision.deploys.base import hosts_block
from provision.inventory import Cluster, Node
from provision.up import pipeline

PROFILE = "testbed-converged"
BLOCK = "{{cluster_hosts_block}}"
# The steps a simulated fleet runs: those of a node that is neither the NFS server nor its
# client and does not back up (nfs and backups name the storage host in their commands, and
# the storage host does one account per backing-up host: not a copy of one node).
STEPS = "preflight,base,nvidia,frameworks,volumes"


def _record(cluster: Cluster, host: str) -> list[dict[str, Any]]:
    from pyinfra.connectors.ssh import SSHConnector

    seen: list[dict[str, Any]] = []
    original = SSHConnector.run_shell_command

    def recording(self: SSHConnector, command: Any, *args: Any, **kwargs: Any) -> Any:
        ok, output = original(self, command, *args, **kwargs)
        if self.host.name == host:
            text = command if isinstance(command, str) else command.get_masked_value()
            seen.append(
                {"command": text, "exit": 0 if ok else 1, "stdout": output.stdout_lines, "stderr": output.stderr_lines}
            )
        return ok, output

    SSHConnector.run_shell_command = recording  # type: ignore[method-assign]
    try:
        plans = pipeline.plan(cluster, pipeline.select(only=STEPS))
        if any(ops for p in plans.values() for ops in p.steps.values()) or not all(p.reachable for p in plans.values()):
            raise SystemExit("plan shows changes or an unreachable host: not a converged testbed")
        report = pipeline.up(cluster, pipeline.select(only=STEPS))
        if any(r.changed or r.failures for r in report.hosts.values()):
            raise SystemExit(f"up changed or failed a host: not a converged testbed: {report.hosts}")
        _upload_facts(next(n for n in cluster.nodes if n.name == host))
    finally:
        SSHConnector.run_shell_command = original  # type: ignore[method-assign]
    return seen


def _upload_facts(node: Node) -> None:
    """The read-only facts pyinfra asks before an upload, which a converged run never asks:
    a copy's first `up` writes the fleet's own files (see fleet_standin)."""
    from pyinfra.context import ctx_state
    from pyinfra.facts.server import TmpDir

    from provision.engine.connect import connect_all
    from provision.engine.deadlines import disconnect_bounded
    from provision.engine.pyinfra_state import new_state
    from provision.pyinfra_context import held

    state = new_state([node])
    with held(ctx_state, state):
        connect_all(state)
        (pyinfra_host,) = state.inventory
        pyinfra_host.get_fact(TmpDir)
        disconnect_bounded(state)


def normalise(text: str, node: Node) -> str:
    """The node's own name and cluster address as placeholders."""
    return text.replace(node.cluster_address, "{{address}}").replace(node.name, "{{name}}")


def _lines(lines: list[str], block: list[str], node: Node) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i : i + len(block)] == block:
            out.append(BLOCK)
            i += len(block)
        else:
            out.append(normalise(lines[i], node))
            i += 1
    return out


def capture(inventory_path: Path, host: str | None = None) -> Path:
    cluster = inventory.load(inventory_path)
    storage = cluster.storage_node()
    node = next(n for n in cluster.nodes if (n.name == host if host else n is not storage))
    others = [n.name for n in cluster.nodes if n is not node]
    block = hosts_block(list(cluster.nodes)).split("\n")
    commands: dict[str, dict[str, Any]] = {}
    for seen in _record(cluster, node.name):
        key = normalise(seen["command"], node)
        if key in commands:  # asked again later in the run: the first answer is the one kept
            continue
        answer = {k: _lines(seen[k], block, node) for k in ("stdout", "stderr")}
        if any(other in key for other in others):
            raise SystemExit(f"a command names another host, which a copy cannot follow: {key[:120]}")
        commands[key] = {"exit": seen["exit"], **answer}
    # its connection is the simulation's, and it backs up in no simulated fleet (STEPS)
    data = {
        k: json.loads(normalise(json.dumps(v), node))
        for k, v in node.data.items()
        if not k.startswith("ssh_") and k != "backup_paths"
    }
    first = block[0]
    owner = cluster.nodes[0]
    header = {
        "captured": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{node.name} of {inventory_path.name} ({len(cluster.nodes)} nodes); plan and up changed nothing",
        "how": f"python -m tests.standins.fleet_profiles.capture_up {inventory_path.name} {node.name}",
    }
    path = Path(__file__).parent / f"{PROFILE}.json"
    doc = {
        "source": header,
        "host_data": data,
        "hosts_line": first.replace(owner.cluster_address, "{{address}}").replace(owner.name, "{{name}}"),
        "commands": commands,
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(capture(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
