"""The validate_budgets_s setting: its phase names are the agent's, checked at load."""

from __future__ import annotations

import pytest

from provision.metrics import AGENT_PHASES
from provision.settings import parse_settings
from provision.validate import agent


@pytest.mark.parametrize("mode", sorted(agent.BUDGETS_S))
def test_the_settings_phase_list_is_the_agents(mode):
    # The agent runs alone on a node and cannot import provision.metrics: the list is
    # written twice, and this holds them equal.
    assert tuple(agent.BUDGETS_S[mode]) == AGENT_PHASES


def test_budgets_within_bounds_load():
    settings, problems = parse_settings({"validate_budgets_s": {"cpu": 300, "disk": 90.5}}, "inv.py: host a")
    assert problems == []
    assert settings.validate_budgets_s == {"cpu": 300, "disk": 90.5}


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"gpu": 60}, "'gpu': unknown phase (one of cpu, ram, disk, gemm, hbm, copies, burn, allreduce)"),
        ({"cpu=1,ram": 60}, "'cpu=1,ram': unknown phase"),
        ({"cpu": 0}, "cpu: 0 is not between 1 and 86400 seconds"),
        ({"cpu": 100000}, "cpu: 100000 is not between 1 and 86400 seconds"),
        ({"cpu": True}, "cpu"),
        ({"cpu": "60"}, "cpu"),
        ([60], "validate_budgets_s"),
    ],
)
def test_bad_budgets_are_refused_at_load_with_the_key_named(value, said):
    _, problems = parse_settings({"validate_budgets_s": value}, "inv.py: host a")
    assert problems, value
    text = "; ".join(str(p) for p in problems)
    assert "validate_budgets_s" in text
    assert said in text
