"""The demo's ordering and resume logic, with a recording runner in place of the child
processes (the stages themselves are tested end to end by their own suites)."""

from __future__ import annotations

from provision.demo.stages import DemoPaths, run_demo


class RecordingRunner:
    """Test stand-in for run_provision: records argv, fails the stages it is told to."""

    def __init__(self, inventory, fail=()):
        self.inventory, self.fail, self.calls = inventory, set(fail), []

    def __call__(self, argv, log):
        self.calls.append(argv)
        if argv[:2] == ["testbed", "up"] and not self.inventory.exists():
            self.inventory.write_text("nodes = []  # testbed 1\n")
        command = " ".join(argv[:2]) if argv[0] in ("testbed", "backup") else argv[0]
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"\x1b[1mworking\x1b[0m\n{command}: summary line\n\n")
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
        "testbed up",
        "up",
        "verify",
        "validate",
        "monitor",
        "train",
        "backup run",
        "backup restore",
    ]
    assert all(status == "done" for _, status in names(results))


def test_failed_stage_stops_the_pipeline_and_exits_1(tmp_path):
    runner = RecordingRunner(tmp_path / "testbed.py", fail={"validate"})
    results, code = run_demo(paths(tmp_path), 2, lambda *a: None, runner)
    assert code == 1
    assert names(results)[3:] == [
        ("validate", "failed"),
        ("monitor", "not run"),
        ("train", "not run"),
        ("backup", "not run"),
        ("restore", "not run"),
    ]


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


def test_each_stage_keeps_a_log_and_its_last_line_in_the_summary(tmp_path):
    p = paths(tmp_path)
    results, _ = run_demo(p, 2, lambda *a: None, RecordingRunner(tmp_path / "testbed.py"))
    by_name = {r.name: r for r in results}
    assert by_name["up"].outcome == "up: summary line"  # colours and blank lines dropped
    assert str(p.log("up")) in by_name["up"].artifacts
    assert p.log("up").is_file()
    assert p.log("testbed").is_file()
    again, _ = run_demo(p, 2, lambda *a: None, RecordingRunner(tmp_path / "testbed.py"))
    assert {r.name: r.outcome for r in again}["up"] == "up: summary line"  # done earlier: from its log


def test_the_testbed_is_asked_to_write_the_inventory_the_demo_reads(tmp_path):
    runner = RecordingRunner(tmp_path / "testbed.py")
    run_demo(paths(tmp_path), 2, lambda *a: None, runner)
    testbed_argv = runner.calls[0]
    assert testbed_argv[testbed_argv.index("--inventory") + 1] == str(tmp_path / "testbed.py")


def test_a_command_that_ends_with_a_table_is_summed_up_by_its_rows(tmp_path):
    from provision.demo.stages import last_line

    log = tmp_path / "backup.log"
    log.write_text(
        "⠙ node1            done 0:00:14\n                   backup run\n"
        "┏━━━━━━━┳━━━━━━━━┓\n┃ host  ┃ result ┃\n┡━━━━━━━╇━━━━━━━━┩\n"
        "│ node1 │ ok     │\n│       │ (more) │\n│ node2 │ FAILED │\n└───────┴────────┘\n"
    )
    assert last_line(log) == "node1 ok; node2 FAILED"
