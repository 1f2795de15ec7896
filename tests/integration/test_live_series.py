"""The running job's figures for Prometheus (launch/live.py), written over a real SSH
connection (loopback sshd) into a textfile directory: parsed from rank 0's lines, read
by the real promtool, removed at the end; nothing written where
the monitoring step has not run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provision import remote
from provision.inventory import SshTarget
from provision.launch import live, logs
from provision.rules import monitoring
from tests.helpers import loopback_sshd

PROMTOOL = Path(sys.executable).parent / "promtool"


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    c = remote.connection(SshTarget("127.0.0.1", server.port, "root", str(server.key), str(server.known_hosts), "yes"))
    yield c
    c.close()
    server.stop()


def _curves(*lines: str) -> logs.Curves:
    curves = logs.Curves()
    for line in lines:
        curves.feed(line)
    return curves


@pytest.fixture
def textfiles(tmp_path, monkeypatch) -> Path:
    """The textfile directory moved into the test's tmp_path (the hosts here are this
    machine, over loopback SSH)."""
    monkeypatch.setattr(monitoring, "TEXTFILE_DIR", str(tmp_path))
    return tmp_path


def test_rank_0_s_figures_are_written_rewritten_and_removed(conn, textfiles) -> None:
    curves = _curves("step 7/20 | train loss 4.2500 | lr 3.00e-04 | 1234 tok/s | 80.0 ms")
    series = live.LiveSeries("train-1-ab", {"n1": conn}, curves, clock=lambda: 1796500000.0)
    series.rank0_on = "n1"
    series.offsets["n1"] = 0.0  # the node's clock taken as the controller's (read in the next test)
    series.publish()
    path = textfiles / "provision_train_train-1-ab.prom"
    text = path.read_text()
    assert 'provision_train_step{run="train-1-ab"} 7.0' in text
    assert 'provision_train_loss{run="train-1-ab"} 4.25' in text
    assert 'provision_train_tokens_per_second{run="train-1-ab"} 1234.0' in text
    assert 'provision_train_updated_timestamp_seconds{run="train-1-ab"} 1796500000.0' in text
    checked = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # a new step is written over the file
    curves.feed("step 8/20 | train loss 4.0000 | lr 3.00e-04 | 1300 tok/s | 80.0 ms")
    series.publish()
    assert 'provision_train_step{run="train-1-ab"} 8.0' in path.read_text()
    series.stop()
    assert not path.exists()


def test_the_update_time_is_the_nodes_clock_and_a_dead_runs_file_is_removed(conn, textfiles) -> None:
    """A controller an hour behind the node still writes the node's time (what Prometheus
    compares with); a file an older run left two hours ago goes, a fresh one stays."""
    import os
    import time

    dead, other = textfiles / "provision_train_train-0-old.prom", textfiles / "provision_train_train-9.prom"
    for path in (dead, other):
        path.write_text("provision_train_step 1\n")
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    curves = _curves("step 3/20 | train loss 4.0000 | lr 3.00e-04 | 100 tok/s | 80.0 ms")
    series = live.LiveSeries("train-4", {"n1": conn}, curves, clock=lambda: time.time() - 3600)
    series.rank0_on = "n1"
    series.publish()
    text = (textfiles / "provision_train_train-4.prom").read_text()
    (stamp,) = [line for line in text.splitlines() if line.startswith("provision_train_updated_timestamp_seconds{")]
    assert abs(float(stamp.split()[-1]) - time.time()) < 10, stamp
    assert not dead.exists()
    assert other.exists()
    series.stop()


def test_a_host_without_the_monitoring_step_gets_nothing(conn, tmp_path, monkeypatch) -> None:
    missing = tmp_path / "no-such-directory"
    curves = _curves("step 1/2 | train loss 5.0000 | lr 1.00e-03 | 10 tok/s | 1.0 ms")
    assert curves.train == [(1, 5.0)]
    monkeypatch.setattr(monitoring, "TEXTFILE_DIR", str(missing))
    series = live.LiveSeries("train-2", {"n1": conn}, curves)
    series.rank0_on = "n1"
    series.publish()
    assert series.failed == {}
    assert series.written_on is None
    assert not missing.exists()


def test_before_rank_0_speaks_nothing_is_written(conn, textfiles) -> None:
    series = live.LiveSeries("train-3", {"n1": conn}, logs.Curves())
    series.publish()
    series.rank0_on = "n1"
    series.publish()  # no step logged yet
    assert list(textfiles.iterdir()) == []


def test_a_run_id_that_is_not_a_file_name_is_refused() -> None:
    with pytest.raises(ValueError, match="not a run id"):
        live.path_for("../../etc/cron.d/x")
