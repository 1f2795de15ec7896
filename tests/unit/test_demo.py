"""The demo's ordering and resume logic, with a recording runner in place of the child
processes (the stages themselves are tested end to end by their own suites)."""

from __future__ import annotations

from provision.demo import DemoPaths, run_demo


class RecordingRunner:
    """Test stand-in for run_provision: records argv, fails the stages it is told to."""

    def __init__(self, inventory, fail=()):
        self.inventory, self.fail, self.calls = inventory, set(fail), []

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[:2] == ["testbed", "up"] and not self.inventory.exists():
            self.inventory.write_text("nodes = []  # testbed 1\n")
        command = " ".join(argv[:2]) if argv[0] in ("testbed", "backup") else argv[0]
        return 1 if command in self.fail else 0


def paths(tmp_path):
    return DemoPaths(tmp_path / "runs" / "demo", tmp_path / "testbed.py")


def names(results):
    return [(r.name, r.status) for r in results]


def test_runs_every_stage_in_order(tmp_path):
    runner = RecordingRunner(tmp_path / "testbed.py")
    results, code = run_demo(paths(tmp_path), 2, lambda *a: None, runner)
    assert code == 0
    assert [c[0] if c[0] not in ("testbed", "backup") else " ".join(c[:2]) for c in runner.calls] == [
        "testbed up", "up", "verify", "validate", "train", "backup run", "backup restore"]
    assert all(status == "done" for _, status in names(results))


def test_failed_stage_stops_the_pipeline_and_exits_1(tmp_path):
    runner = RecordingRunner(tmp_path / "testbed.py", fail={"validate"})
    results, code = run_demo(paths(tmp_path), 2, lambda *a: None, runner)
    assert code == 1
    assert names(results)[3:] == [("validate", "failed"), ("train", "not run"), ("backup", "not run"),
                                  ("restore", "not run")]


def test_second_run_continues_where_the_first_stopped(tmp_path):
    p = paths(tmp_path)
    run_demo(p, 2, lambda *a: None, RecordingRunner(tmp_path / "testbed.py", fail={"train"}))
    again = RecordingRunner(tmp_path / "testbed.py")
    results, code = run_demo(p, 2, lambda *a: None, again)
    assert code == 0
    assert [c[0] for c in again.calls] == ["testbed", "train", "backup", "backup"]
    assert dict(names(results))["up"] == "done earlier"


def test_a_new_testbed_starts_the_pipeline_over(tmp_path):
    p = paths(tmp_path)
    run_demo(p, 2, lambda *a: None, RecordingRunner(tmp_path / "testbed.py"))
    (tmp_path / "testbed.py").write_text("nodes = []  # testbed 2: new ports and keys\n")
    again = RecordingRunner(tmp_path / "testbed.py")
    run_demo(p, 2, lambda *a: None, again)
    assert [c[0] for c in again.calls][:3] == ["testbed", "up", "verify"]
