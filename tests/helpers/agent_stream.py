"""The agent's stdout (JSON lines, agent_stream.AGENT_SCHEMA) for a test's agent document.

Tests describe what an agent reported as one dict (agent.run() returns the same shape);
the controller reads the stream the agent prints. This writes that stream: a start line,
the inventory, one line per result row and the end line, as agent.Results writes them."""

from __future__ import annotations

import json
from typing import Any

from provision.validate import agent_stream


def agent_lines(doc: dict[str, Any]) -> str:
    """The JSON lines an agent that finished prints for ``doc`` (a run() document)."""
    keys = ("hostname", "mode", "python", "torch", "inventory", "gpus", "nvidia_smi_xml")
    lines = [
        {"type": "start", "agent": agent_stream.AGENT_SCHEMA, "mode": doc.get("mode", "quick"), "deadline_s": 480},
        {"type": "inventory", **{k: doc[k] for k in keys if k in doc}},
        *({"type": "row", **row} for row in doc.get("results", [])),
        {"type": "end", "errors": doc.get("errors", [])},
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)
