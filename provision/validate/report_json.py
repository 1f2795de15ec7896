"""The machine-readable report: a versioned schema, one record per node and metric.

Schema ``provision.validate/1``::

    {"schema": "provision.validate/1", "created": ISO-8601, "inventory": path, "mode": "quick",
     "groups": ["cpu", ...], "summary": {"pass": n, "warn": n, "fail": n, "exit_code": 0|1},
     "nodes": [{"node", "verdict", "sku", "errors", "inventory"}],
     "records": [{"node", "metric", "device", "value", "unit", "expectation", "verdict", "reason"}],
     "network": {"pairs": [{"a", "b", "gbits", "round"}], "blamed": {node: reason}}}
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.validate.records import NodeResult

SCHEMA = "provision.validate/1"


@dataclass
class RunInfo:
    """What was run, for the report header."""

    inventory: str  # inventory file
    mode: str  # quick or full
    groups: list[str]  # --only groups
    exit_code: int  # what the command exits with
    created: str = field(  # when the run finished, UTC
        default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    )
    network: dict[str, Any] = field(default_factory=dict)  # pairs and bisect results


def document(results: list[NodeResult], run: RunInfo) -> dict[str, Any]:
    summary: dict[str, int] = {"pass": 0, "warn": 0, "fail": 0}
    for r in results:
        summary[r.verdict if r.verdict in summary else "warn"] += 1
    return {
        "schema": SCHEMA,
        "created": run.created,
        "inventory": run.inventory,
        "mode": run.mode,
        "groups": run.groups,
        "summary": {**summary, "exit_code": run.exit_code},
        "nodes": [
            {"node": r.node, "verdict": r.verdict, "sku": r.sku, "errors": r.errors, "inventory": r.inventory}
            for r in results
        ],
        "records": [asdict(f) for r in results for f in r.findings],
        "network": run.network,
    }


def write(path: str | Path, results: list[NodeResult], run: RunInfo) -> None:
    Path(path).write_text(json.dumps(document(results, run), indent=2, default=str) + "\n")
