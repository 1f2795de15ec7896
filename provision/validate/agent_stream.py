"""The agent's stdout, read as the controller sees it: JSON lines, complete or cut off.

The agent (``agent.py``) writes one JSON object per line as it goes: a start line, the
inventory, the plan of phases, each phase's start and end, each result row, an end line.
An agent stopped at its deadline leaves a prefix of that stream; every row in it is kept,
and the rows its planned phases still owed become "timed out" reasons naming the phase.
Pure: text in, an ``AgentReport`` out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from provision.validate.parsers import ParseError, gpu_from_nvml, nvidia_smi_xml
from provision.validate.records import GpuInfo, Measurement

# The "agent" field of the agent's start line. 2: a stream of JSON lines (start, inventory,
# plan, phase start/end, one per result row, end) instead of one document at the end.
AGENT_SCHEMA = 2


@dataclass(frozen=True)
class AgentReport:
    """What the agent measured on one node."""

    node: str  # inventory name (the agent does not know it; the controller does)
    hostname: str  # the node's own hostname
    inventory: dict[str, Any]  # cpu / ram / disk / nics / torch version, as the agent saw them
    gpus: tuple[GpuInfo, ...]  # from NVML, or from nvidia-smi -q -x when pynvml is missing
    measurements: tuple[Measurement, ...]  # every metric the agent ran or could not run
    errors: tuple[str, ...]  # problems that stopped part of the run
    stopped_in: str = ""  # the phase running when the output ended early; "" when it finished
    deadline_s: int = 0  # the agent's whole-run deadline, as it computed it


def _json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the stream, one per line; anything else (a library's warning
    on stdout, a line cut off when the agent was killed) is skipped."""
    out = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "type" in data:
            out.append(data)
    return out


def agent_output(text: str, node: str) -> AgentReport:
    """Parse the agent's stdout, complete or cut off at a deadline: every row that arrived
    is kept; rows of phases that never reported say they timed out, naming the phase.
    Raises ParseError when it is not an agent's output at all."""
    lines = _json_lines(text)
    start = next((d for d in lines if d["type"] == "start"), None)
    if start is None:
        raise ParseError(f"agent: no start line in output: {text.strip()[:200]!r}")
    if start.get("agent") != AGENT_SCHEMA:
        raise ParseError(f"agent: schema {start.get('agent')!r}, expected {AGENT_SCHEMA}")
    data = next((d for d in lines if d["type"] == "inventory"), {})
    # A GPU NVML could not read has only its index and an error; the agent reports it as
    # not-run rows of that GPU, and it has no inventory to judge.
    gpus = [gpu_from_nvml(g) for g in data.get("gpus") or [] if not g.get("error")]
    if not gpus and data.get("nvidia_smi_xml"):
        gpus = nvidia_smi_xml(data["nvidia_smi_xml"])
    rows = [d for d in lines if d["type"] == "row"]
    end = next((d for d in lines if d["type"] == "end"), None)
    deadline = int(start.get("deadline_s") or 0)
    stopped = "" if end else _running(lines)
    rows += _owed(lines, rows, stopped, deadline)
    measurements = tuple(
        Measurement(
            node,
            r["metric"],
            None if r.get("value") is None else float(r["value"]),
            r.get("device", ""),
            r.get("not_run", ""),
            r.get("detail", ""),
        )
        for r in rows
    )
    return AgentReport(
        node,
        str(data.get("hostname", "")),
        {**data.get("inventory", {}), "torch": data.get("torch")} if data else {},
        tuple(gpus),
        measurements,
        tuple(end.get("errors", []) if end else []),
        stopped,
        deadline,
    )


STARTUP = "start-up (python, torch import, inventory)"  # where an agent stops before its plan


def _running(lines: list[dict[str, Any]]) -> str:
    """The phase(s) started and not ended when the output stops; start-up before the plan."""
    if not any(d["type"] == "plan" for d in lines):
        return STARTUP
    started = [d["phase"] for d in lines if d["type"] == "phase" and d.get("state") == "start"]
    ended = {d["phase"] for d in lines if d["type"] == "phase" and d.get("state") == "end"}
    running = [p for p in started if p not in ended]
    return ", ".join(running) or "between phases"


def _owed(lines: list[dict[str, Any]], rows: list[dict[str, Any]], stopped: str, deadline: int) -> list[dict[str, Any]]:
    """A not-run row for each (metric, device) a planned phase owed and never sent."""
    plan: list[dict[str, Any]] = next((d["phases"] for d in lines if d["type"] == "plan"), [])
    got = {(r["metric"], r.get("device", "")) for r in rows}
    started = {d["phase"] for d in lines if d["type"] == "phase" and d.get("state") == "start"}
    out = []
    for p in plan:
        if stopped and p["phase"] in started:
            why = f"not run: timed out after {deadline} s (the agent's deadline) in phase {p['phase']}"
        elif stopped:
            why = (
                f"not run: timed out after {deadline} s (the agent's deadline) in phase {stopped}, before {p['phase']}"
            )
        else:
            why = f"not run: phase {p['phase']} sent no result"
        for metric in p["metrics"]:
            if (metric, p["device"]) not in got:
                out.append({"metric": metric, "device": p["device"], "value": None, "not_run": why})
    return out
