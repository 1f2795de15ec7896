"""The provisioned-testbed cache's pure parts (tests/e2e/snapshot.py): its key follows
every input of `up` and nothing else, and a stored report comes back field for field."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.engine import Failure, HostResult, RunReport
from provision.testbed import Testbed
from tests.e2e import snapshot


@pytest.fixture
def tb(tmp_path: Path) -> Testbed:
    return Testbed(tmp_path / "state", images_dir=tmp_path / "images", mirror="http://mirror.invalid/debian")


def test_key_is_stable_and_follows_shape(tb: Testbed) -> None:
    assert snapshot.key(tb, {"nodes": 2}) == snapshot.key(tb, {"nodes": 2})
    assert snapshot.key(tb, {"nodes": 2}) != snapshot.key(tb, {"nodes": 3})


def test_key_changes_when_any_up_input_changes(tb: Testbed, tmp_path: Path, monkeypatch) -> None:
    inputs = snapshot._up_inputs()
    names = {str(p.relative_to(snapshot.ROOT)) for p in inputs}
    # the deploys, the operations, the rules, the engine, the settings and the templates count
    for expected in (
        "provision/deploys/base.py",
        "provision/operations/apt.py",
        "provision/rules/packages.py",
        "provision/engine/run.py",
        "provision/settings.py",
        "templates/base/limits.conf.j2",
    ):
        assert expected in names
    # the other commands do not: the layer rules keep `up` from importing them
    assert not any(n.startswith(("provision/validate/", "provision/launch/", "provision/cli/")) for n in names)
    probe = tmp_path / "provision" / "deploys" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("A = 1\n")
    monkeypatch.setattr(snapshot, "ROOT", tmp_path)
    monkeypatch.setattr(snapshot, "_up_inputs", lambda: [probe])
    before = snapshot.key(tb, {})
    probe.write_text("A = 2\n")
    one = snapshot.key(tb, {})
    probe.rename(probe.with_name("renamed.py"))
    monkeypatch.setattr(snapshot, "_up_inputs", lambda: [probe.with_name("renamed.py")])
    two = snapshot.key(tb, {})
    assert len({before, one, two}) == 3


def test_report_round_trips_every_field() -> None:
    host = HostResult(
        "node1",
        steps=["preflight", "base"],
        changed=3,
        changed_by_step={"base": 3},
        failures=[Failure("nfs", "export refused: no such path")],
        notes=["nvidia: skipped (no NVIDIA GPU on the PCI bus)"],
        rebooted=True,
    )
    report = RunReport({"node1": host, "node2": HostResult("node2", reachable=False)})
    back = snapshot.report_from_json(snapshot.report_to_json(report))
    assert back == report
    assert back.exit_code == report.exit_code
