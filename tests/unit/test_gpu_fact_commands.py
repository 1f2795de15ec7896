"""benchmarks/gpu_fact_commands.json is what the device check runs on a lent GPU machine (its
image has no pyinfra): it must be the fact classes' own command text, or the check would
prove an old command."""

from __future__ import annotations

import json
from pathlib import Path

from provision.facts.gpus import NvidiaDevices
from provision.facts.probes import RebootProbe
from provision.facts.stack import StackFact

KEPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_fact_commands.json"


def test_the_device_checks_fact_commands_are_the_facts_own():
    kept = json.loads(KEPT.read_text())
    real = {
        "nvidia-devices": NvidiaDevices().command(),
        "reboot-probe": RebootProbe().command(),
        "stack": StackFact().command(),
    }
    assert kept == real, f"regenerate {KEPT.name} from the fact classes (see its test)"
