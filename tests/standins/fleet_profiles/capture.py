"""Record a fleet stand-in profile: run the real facts that `provision facts` and
`provision status` gather on THIS machine, through pyinfra's own ``@local`` connector,
and store every command exactly as pyinfra sent it, with its exit code and output.

    .venv/bin/python -m tests.standins.fleet_profiles.capture debian12-cpu

Nothing is edited: the profile is what this host answered (hostname, addresses and
serial numbers included), with the capture's date and host in its header.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from pyinfra.connectors.local import LocalConnector
from pyinfra.context import ctx_state

from provision import engine
from provision.engine.connect import connect_all
from provision.engine.deadlines import disconnect_bounded
from provision.engine.pyinfra_state import new_state
from provision.facts.host import HOST_FACTS
from provision.inventory import Cluster, Node, SshTarget
from provision.pyinfra_context import held
from provision.settings import Settings
from provision.status.gather import gather_status


def capture(profile: str) -> Path:
    """Gather the facts on this machine, recording every command; write the profile."""
    commands: dict[str, dict[str, Any]] = {}
    original = LocalConnector.run_shell_command

    def recording(self: LocalConnector, command: Any, *args: Any, **kwargs: Any) -> Any:
        ok, output = original(self, command, *args, **kwargs)
        text = command if isinstance(command, str) else command.get_masked_value()
        commands[text] = {"exit": 0 if ok else 1, "stdout": output.stdout_lines, "stderr": output.stderr_lines}
        return ok, output

    LocalConnector.run_shell_command = recording  # type: ignore[method-assign]
    node = Node("@local", SshTarget("localhost", 22, "root", None, None, "yes"), (), Settings(), {})
    result = engine.gather_facts([node], HOST_FACTS)
    if result.failed:
        raise SystemExit(f"facts failed here: {result.failed}")
    gather_status(Cluster(path=Path("captured"), nodes=(node,)))
    # The Os fact alone, as a step asks it (fleet_standin.fact_only_step): gather_facts
    # asks its facts in one batched command, a step's operation one fact at a time.
    state = new_state([node])
    with held(ctx_state, state):
        connect_all(state)
        (host,) = state.inventory
        fact, kwargs = HOST_FACTS["os"]
        host.get_fact(fact, **kwargs)
        disconnect_bounded(state)
    path = Path(__file__).parent / f"{profile}.json"
    header = {
        "captured": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{platform.node()} ({platform.platform()})",
        "how": "python -m tests.standins.fleet_profiles.capture " + profile,
    }
    path.write_text(json.dumps({"source": header, "commands": commands}, indent=1) + "\n")
    return path


if __name__ == "__main__":
    print(capture(sys.argv[1]))
