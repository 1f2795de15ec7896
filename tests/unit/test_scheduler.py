"""Slurm as `status` shows it (provision/scheduler.py, status/summary.py): sinfo's and
squeue's lines in the formats provision asks for, counted into one line, and the nodes that
are not working listed with their reasons."""

from __future__ import annotations

import json

from provision import scheduler
from provision.status import summary
from provision.status.gather import gather_slurm
from tests.unit.test_inventory import write

SINFO_OUT = """node1|mixed|1|none
node2|drained|1|provision: health: /shared/datasets not answering in 10 s
node3|idle*|1|Not responding
node4|idle|1|none
"""
SQUEUE_OUT = """17|RUNNING|alice|2|1:02:03|train|with|bars
18|PENDING|bob|4|0:00|sweep
19|COMPLETING|alice|1|0:10|eval
"""


def _view() -> scheduler.SlurmView:
    return scheduler.SlurmView("node1", scheduler.parse_sinfo(SINFO_OUT), scheduler.parse_squeue(SQUEUE_OUT))


def test_the_queue_is_read_with_a_job_name_that_holds_the_separator():
    jobs = scheduler.parse_squeue(SQUEUE_OUT + "not a job line\n")
    assert [(j.id, j.state, j.user, j.nodes) for j in jobs] == [
        ("17", "RUNNING", "alice", 2),
        ("18", "PENDING", "bob", 4),
        ("19", "COMPLETING", "alice", 1),
    ]
    assert jobs[0].name == "train|with|bars"


def test_one_line_counts_node_states_and_the_queue():
    assert summary.slurm_line(_view()) == (
        "slurm (controller node1): drained x1, idle x1, idle* x1, mixed x1; queue: 1 running, 1 pending, 1 other"
    )
    failed = scheduler.SlurmView("node1", error="node1: exit -1: timed out")
    assert summary.slurm_line(failed) == "slurm (controller node1): no answer: node1: exit -1: timed out"


def test_nodes_not_working_are_listed_with_their_reason_and_a_row_shows_its_state():
    shared = summary.slurm_exceptions(_view())
    assert [(s.key, s.hosts) for s in shared] == [
        (("drained", "provision: health: /shared/datasets not answering in 10 s"), ["node2"]),
        (("idle*", "Not responding"), ["node3"]),
    ]
    assert _view().nodes["node4"].text() == "idle"
    assert _view().nodes["node2"].text() == "drained: provision: health: /shared/datasets not answering in 10 s"


def test_the_json_report_carries_slurms_view_or_null():
    report = json.loads(json.dumps(summary.as_json([], _view())))
    assert report["slurm"]["controller"] == "node1"
    assert report["slurm"]["nodes"]["node2"]["state"] == "drained"
    assert report["slurm"]["jobs"][1]["user"] == "bob"
    assert summary.as_json([])["slurm"] is None


def test_no_slurm_view_is_asked_for_where_no_host_runs_slurm(tmp_path):
    # A TEST-NET host: asking its head would fail on the connection, not return None at once.
    from provision.inventory import load

    cluster = load(write(tmp_path / "inv.py", 'nodes = [("n1", {"ssh_hostname": "192.0.2.1", "slurm": "skip"})]\n'))
    assert gather_slurm(cluster, []) is None
