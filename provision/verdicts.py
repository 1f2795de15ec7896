"""Where validate keeps each host's verdicts on the controller, and the latest one read back.

One JSON line per run and host in ``<state>/validate/<host>.jsonl`` (provision.state's
directory). provision.validate.history writes the lines and draws trends from them; this
module owns the file's place and the last verdict, which layers below validate read too (the
slurm step gives a node that last warned its slurm_warn_weight; status shows the verdict).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from provision import state

_NAME = re.compile(r"[A-Za-z0-9_.@-]+")


def state_dir() -> Path:
    """Where the verdicts live: validate/ in the controller's state directory."""
    return state.state_dir() / "validate"


def host_file(host: str, base: Path | None = None) -> Path | None:
    """The host's file, or None for a name validate could never have recorded under."""
    if not _NAME.fullmatch(host) or host.startswith("."):
        return None
    return (base or state_dir()) / f"{host}.jsonl"


def lines(path: Path) -> list[dict[str, Any]]:
    """The file's records; a line cut short by a crash is skipped, the rest still count."""
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def last_run(host: str, base: Path | None = None) -> tuple[str, str] | None:
    """(verdict, created) of the host's latest recorded run; None when it has none."""
    path = host_file(host, base)
    if path is None or not path.is_file():
        return None
    records = lines(path)
    if not records:
        return None
    return str(records[-1].get("verdict", "")), str(records[-1].get("created", ""))
