"""validate --drain's decisions (provision/validate/drain.py): sinfo's lines read, and for each
judged node what is done to it in Slurm. Verdicts come from the real judge on synthetic
fleets; sinfo's format is the one SINFO asks for (node|state|weight|reason)."""

from __future__ import annotations

from provision import scheduler
from provision.validate import drain as slurm_nodes
from provision.validate import judge
from provision.validate.records import NodeResult
from tests.unit.test_validate_judge import gpu_node

SINFO_OUT = """n1|idle|1|none
n2|drained|1|admin: bad fan ticket 42
n3|drained|1|provision: validate: gpu_bf16_tflops[gpu0] 450 < 0.5 x 989.5 (validate run 2026-12-01T10:00:00Z)
n4|drained*|1|provision: health: / 99% full
n5|mixed|10|none
n5|mixed|10|none
"""


def test_sinfo_lines_are_read_once_per_node_with_state_weight_and_reason():
    states = scheduler.parse_sinfo(SINFO_OUT + "garbage line\n")
    assert list(states) == ["n1", "n2", "n3", "n4", "n5"]
    assert states["n2"] == scheduler.SlurmState("drained", 1, "admin: bad fan ticket 42")
    assert states["n4"].drained
    assert not states["n5"].drained
    assert states["n5"].weight == 10


def _results(verdicts: dict[str, list[float]]):
    """Nodes judged by the real judge: 800 TFLOP/s passes, 450 fails an H100's floor."""
    return {r.node: r for r in judge.judge([gpu_node(name, bf16) for name, bf16 in verdicts.items()])}


def test_a_failed_node_is_drained_with_its_evidence_and_the_run():
    results = _results({"n1": [450.0], "x": [800.0]})
    (action,) = slurm_nodes.plan([results["n1"]], scheduler.parse_sinfo(SINFO_OUT), "RUN1", {})
    assert action.kind == "drain"
    assert action.detail.startswith("provision: validate: gpu_bf16_tflops[gpu0] ")
    assert action.detail.endswith(" (validate run RUN1)")
    assert "450" in action.detail
    assert action.command.startswith("scontrol update NodeName=n1 State=DRAIN Reason='provision: validate: ")


def test_someone_elses_reason_stays_in_any_state_and_the_health_checks_drain_is_taken_over():
    results = _results({"n2": [450.0], "n4": [450.0], "x": [800.0]})
    states = scheduler.parse_sinfo(SINFO_OUT)
    actions = slurm_nodes.plan([results["n2"], results["n4"]], states, "RUN1", {})
    assert [(a.node, a.kind) for a in actions] == [("n2", "leave"), ("n4", "drain")]
    assert actions[0].detail == "drained, someone else's: admin: bad fan ticket 42"
    assert actions[1].detail.startswith("provision: validate: ")  # the health check lifts only its own
    # A node an admin set DOWN is theirs too, though not drained.
    down = {"n1": scheduler.SlurmState("down", 1, "RMA pending")}
    failed = _results({"n1": [450.0], "x": [800.0]})
    (left,) = slurm_nodes.plan([failed["n1"]], down, "RUN1", {})
    assert (left.kind, left.detail) == ("leave", "down, someone else's: RMA pending")
    # A node healthy again is not resumed from an admin's or the health check's drain either.
    passed = _results({"n2": [800.0], "n4": [800.0]})
    assert slurm_nodes.plan([passed["n2"], passed["n4"]], states, "RUN2", {}) == []


def test_a_node_validate_drained_is_resumed_once_it_passes_and_a_warning_one_gets_its_weight():
    passed = _results({"n3": [800.0], "n1": [800.0]})
    states = scheduler.parse_sinfo(SINFO_OUT)
    (resume,) = slurm_nodes.plan([passed["n3"]], states, "RUN2", {})
    assert (resume.kind, resume.command) == ("resume", "scontrol update NodeName=n3 State=RESUME")
    # n5 warns (one GPU 12 % under its peers) and is given its weight; already at it: nothing.
    warned = _results({"n5": [800.0] * 7 + [700.0], "a": [800.0] * 8, "b": [800.0] * 8})
    assert warned["n5"].verdict == "warn"
    (weight,) = slurm_nodes.plan([warned["n5"]], states, "RUN3", {"n5": 5})
    assert (weight.kind, weight.command) == ("weight", "scontrol update NodeName=n5 Weight=5")
    assert slurm_nodes.plan([warned["n5"]], states, "RUN3", {"n5": 10}) == []
    # A passing node's weight goes back to 1.
    back = _results({"n5": [800.0], "n1": [800.0]})
    assert [a.command for a in slurm_nodes.plan([back["n5"]], states, "RUN4", {"n5": 10})] == [
        "scontrol update NodeName=n5 Weight=1"
    ]


def test_a_failed_node_drained_with_the_same_reason_is_not_drained_again_and_one_outside_slurm_is_named():
    results = _results({"n1": [450.0], "gone": [450.0], "x": [800.0]})
    reason = slurm_nodes.evidence(results["n1"], "RUN1")
    states = {"n1": scheduler.SlurmState("drained", 1, reason)}
    actions = slurm_nodes.plan([results["n1"], results["gone"]], states, "RUN1", {})
    assert [(a.node, a.kind) for a in actions] == [("gone", "leave")]
    assert "not in Slurm" in actions[0].detail


def test_the_drain_reason_is_one_printable_line_of_bounded_length():
    long = _results({"n1": [450.0] * 8})["n1"]
    reason = slurm_nodes.evidence(long, "RUN1")
    assert len(reason) <= slurm_nodes.REASON_MAX
    assert reason.endswith("... (validate run RUN1)")
    # An unreachable node's evidence is its error, a host's output: made one printable line.
    unreachable = NodeResult("n9", "fail", errors=["unreachable:\nssh: \x1b[31mrefused"])
    reason = slurm_nodes.evidence(unreachable, "RUN1")
    assert reason == "provision: validate: unreachable: ssh:  [31mrefused (validate run RUN1)"


def test_validate_drain_without_any_slurm_host_is_bad_input_before_any_host(cli, tmp_path):
    # TEST-NET hosts: contacting one would hang or fail on the connection, not exit 2 at once.
    path = tmp_path / "inv.py"
    path.write_text('nodes = [("n1", {"ssh_hostname": "192.0.2.1", "slurm": "skip"})]\n')
    result = cli("validate", str(path), "--drain")
    assert result.code == 2, result.err
    assert "--drain: no host runs Slurm (slurm = skip on every host)" in result.err
    assert "Traceback" not in result.err
