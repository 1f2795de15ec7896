"""History per host: append, read back, trend."""

from __future__ import annotations

import pytest

from provision.errors import InputError
from provision.validate import history, judge
from provision.validate.records import Measurement


def results(triad: float):
    return judge.judge(
        [
            judge.NodeInput(
                "node1",
                [
                    Measurement("node1", "ram_triad_gbs", triad),
                    Measurement("node1", "gpu_bf16_tflops", None, not_run=judge.NO_GPU),
                ],
            )
        ]
    )


def test_runs_append_and_trend_shows_change_since_previous(tmp_path):
    history.append(results(20.0), "2026-01-01T00:00:00+00:00", "quick", tmp_path)
    history.append(results(18.0), "2026-01-02T00:00:00+00:00", "quick", tmp_path)
    lines = history.read("node1", tmp_path)
    assert [line["verdict"] for line in lines] == ["pass", "pass"]
    assert "gpu_bf16_tflops" not in lines[0]["values"]  # not-run values are not history
    (row,) = history.trend(lines)
    assert (row.key, row.runs, row.first, row.latest) == ("ram_triad_gbs", 2, 20.0, 18.0)
    assert row.change == pytest.approx(-0.1)


def test_unknown_host_history_is_input_error(tmp_path):
    with pytest.raises(InputError, match="no validate history"):
        history.read("nobody", tmp_path)


def test_host_name_cannot_escape_the_state_dir(tmp_path):
    with pytest.raises(InputError, match="not a host name"):
        history.read("../etc/passwd", tmp_path)


def test_a_line_torn_by_a_crash_costs_only_itself(tmp_path):
    history.append(results(20.0), "2026-01-01T00:00:00+00:00", "quick", tmp_path)
    with open(tmp_path / "node1.jsonl", "a") as f:
        f.write('{"created": "2026-01-02T00:00:00+00:00", "verd')  # the crash: no newline
    history.append(results(18.0), "2026-01-03T00:00:00+00:00", "quick", tmp_path)
    lines = history.read("node1", tmp_path)
    assert [line["created"][:10] for line in lines] == ["2026-01-01", "2026-01-03"]
    assert history.last_run("node1", tmp_path) == ("pass", "2026-01-03T00:00:00+00:00")


def test_a_history_line_that_is_not_numbers_is_skipped_not_a_crash():
    from provision.validate import history

    lines = [{"values": {"m": "abc", "n": 2.0}}, {"values": [1]}, "junk", {"values": {"n": 4.0, "m": None}}]
    (row,) = history.trend(lines)  # "m" never held a number
    assert (row.key, row.runs, row.first, row.latest, row.change) == ("n", 2, 2.0, 4.0, 1.0)
