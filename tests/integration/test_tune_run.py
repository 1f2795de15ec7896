"""`provision tune` on two network-namespace hosts over real SSH: real Optuna (TPE, the
median pruner, the journal storage), the real trainer on each host (alone: one rank), the
stop file a pruned trial reads, the best checkpoint copied and evaluated again; Ctrl-C and
--resume; a host lost mid-study (its network cut, its trial killed), whose trial runs
again on the other host. The same sweep runs on the testbed's VMs in
tests/e2e/test_tune_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision.tune import results
from tests.integration.test_train_launch import alive, processes_of

STUDY_TIMEOUT_S = 420  # a whole `provision tune` call, bounded
# The tiny model on one thread: about 15 ms a step here, so an evaluation every 50 steps
# leaves the controller most of a second to write the stop file before the next one.
TRIAL = ["--steps", "300", "--eval-interval", "50", "--threads", "1"]
TRAINER = ["--", "--data-max-mb", "1", "--eval-samples", "8"]
SPACE = """
[lr]          # wide enough that some trials are hopeless: the pruner has work
low = 1e-5
high = 3e-2
log = true

[warmup-steps]
low = 0
high = 6
"""


@pytest.fixture(scope="module")
def hosts(netns_hosts, tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("node-tune-dir")
    return netns_hosts(2, venv_path=sys.prefix, train_dir=str(node_dir)), node_dir


@pytest.fixture(autouse=True)
def no_trial_outlives_its_test(hosts):
    yield
    stop_runs(hosts[1])


def stop_runs(node_dir: Path) -> None:
    """A test that failed may leave a trial going; stop it by its recorded process group."""
    for pidfile in (node_dir / "runs").glob("*/*/torchrun.pid"):
        pgid = int(pidfile.read_text())
        if alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def start(inventory: Path, cwd: Path, *args: str) -> subprocess.Popen:
    (cwd / "space.toml").write_text(SPACE)
    cmd = [
        sys.executable,
        "-m",
        "provision",
        "tune",
        str(inventory),
        "--space",
        str(cwd / "space.toml"),
        "--runs-dir",
        str(cwd / "runs"),
        "--json",
        *args,
    ]
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=open(cwd / "out.txt", "w"),
        stderr=open(cwd / "err.txt", "w"),
    )


def finish(proc: subprocess.Popen, cwd: Path) -> tuple[int, dict]:
    code = proc.wait(timeout=STUDY_TIMEOUT_S)
    text = (cwd / "out.txt").read_text()
    assert text.strip(), (cwd / "err.txt").read_text()[-3000:]
    return code, json.loads(text)


def tune_processes() -> dict[int, str]:
    return {pid: cmd for pid, cmd in processes_of("tune-").items() if "train_ddp.py" in cmd}


def test_a_study_of_eight_trials_on_two_hosts(hosts, tmp_path):
    cluster, _node_dir = hosts
    proc = start(
        cluster.inventory, tmp_path, "--trials", "8", "--parallel", "2", "--sampler", "tpe", "--pruner", "median",
        "--seed", "7", *TRIAL, *TRAINER,
    )  # fmt: skip
    code, summary = finish(proc, tmp_path)
    err = (tmp_path / "err.txt").read_text()
    assert code == 0, err[-3000:]
    rows = summary["rows"]
    assert len(rows) == 8
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    assert any(r["state"] == "PRUNED" for r in rows), rows
    assert {r["slot"] for r in rows} == {"ns0", "ns1"}  # both hosts ran trials
    (default,) = [r for r in rows if r["default"]]
    assert default["params"] == {"lr": 0.001, "warmup-steps": 5}  # the trainer's own defaults
    assert default["number"] == 0
    best = summary["best"]
    assert best["value"] <= summary["default_value"] == default["value"]
    assert best["value"] == min(r["value"] for r in rows if r["state"] == "COMPLETE")
    # The copy, evaluated again by the trainer from the file: the same loss.
    assert best["problem"] is None
    assert Path(best["checkpoint"]).is_file()
    assert best["evaluated"] == pytest.approx(best["value"], rel=1e-6)
    kept = json.loads(Path(best["json_file"]).read_text())
    assert kept["flags"] == best["params"]
    assert kept["trial"] == best["number"]
    # Once the best is kept, the trials' own checkpoints are gone; the best's copy stays.
    ckpt_dir = Path(best["checkpoint"]).parent.parent
    assert summary["removed_checkpoints"] >= sum(1 for r in rows if r["state"] == "COMPLETE")
    assert not list(ckpt_dir.glob("tune-sweep-t*.pt")), sorted(p.name for p in ckpt_dir.iterdir())
    # A pruned trial's trainer stopped itself (the stop file), before its last step.
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    assert all("pruned at step" in r["reason"] for r in pruned)
    study_dir = Path(summary["study_dir"])
    logs = "\n".join(p.read_text() for p in (study_dir / "trials").glob("*/*.log"))
    assert "stopped: pruned at step" in logs
    report = (study_dir / "report.html").read_text()
    assert report.count("data:image/png;base64,") >= 3, report[:2000]  # history, importances, coordinates...
    assert (study_dir / "study.journal").stat().st_size > 0
    assert tune_processes() == {}
    assert_the_dashboard_opens_the_study(summary["dashboard"], "sweep")


def assert_the_dashboard_opens_the_study(command: str, name: str) -> None:
    """The printed command, as a user would run it (on a loopback port of ours)."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [str(Path(sys.executable).with_name(w)) if w == "optuna-dashboard" else w for w in shlex.split(command)]
    dash = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline, body = time.monotonic() + 60, ""
        while time.monotonic() < deadline and not body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.5)
        assert [s["study_name"] for s in json.loads(body)["study_summaries"]] == [name]
    finally:
        dash.terminate()
        dash.wait(timeout=30)


def test_ctrl_c_stops_every_trial_and_resume_finishes_the_study(hosts, tmp_path):
    cluster, _node_dir = hosts
    args = ["--trials", "5", "--parallel", "2", "--study", "cc", "--seed", "3", *TRIAL]
    first = start(cluster.inventory, tmp_path, *args, *TRAINER)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(tune_processes()) < 2:
        time.sleep(0.2)
    assert len(tune_processes()) >= 2, (tmp_path / "err.txt").read_text()[-3000:]
    first.send_signal(signal.SIGINT)
    code, summary = finish(first, tmp_path)
    assert code == 1
    assert "continue with --resume" in (tmp_path / "err.txt").read_text()
    assert tune_processes() == {}  # every trial stopped, on both hosts
    stopped = [r for r in summary["rows"] if r["state"] == "FAIL"]
    assert 1 <= len(stopped) <= 2, summary["rows"]
    assert all("interrupted" in r["reason"] for r in stopped)
    # --resume with other trial settings is refused: the study would mix two budgets.
    other = start(cluster.inventory, tmp_path, *args, "--steps", "99", "--resume", *TRAINER)
    assert other.wait(timeout=120) == 1
    assert "another space or other trial settings" in (tmp_path / "err.txt").read_text()
    again = start(cluster.inventory, tmp_path, *args, "--resume", *TRAINER)
    code, summary = finish(again, tmp_path)
    assert code == 0, (tmp_path / "err.txt").read_text()[-3000:]
    rows = summary["rows"]
    for s in stopped:  # each interrupted trial asked again, with its flags
        (redone,) = [r for r in rows if r["retry_of"] == s["number"]]
        assert redone["params"] == s["params"]
        assert redone["state"] in ("COMPLETE", "PRUNED")
    assert sum(r["state"] in ("COMPLETE", "PRUNED") for r in rows) == 5  # --trials, counted over both runs
    assert summary["best"]["evaluated"] == pytest.approx(summary["best"]["value"], rel=1e-6)
    assert tune_processes() == {}


def test_a_host_lost_mid_study_its_trial_runs_on_the_other(netns_hosts, tmp_path_factory, tmp_path):
    node_dir = tmp_path_factory.mktemp("node-tune-drill")
    cluster = netns_hosts(2, venv_path=sys.prefix, train_dir=str(node_dir), connect_timeout_s=5)
    try:
        proc = start(
            cluster.inventory, tmp_path, "--trials", "4", "--parallel", "2", "--node-timeout", "10",
            "--pruner", "none", "--seed", "5", *TRIAL, *TRAINER,
        )  # fmt: skip
        victim = wait_for_trial_on(node_dir, "ns1", tmp_path)
        # The host dies: its trial's processes are killed and its network goes silent
        # (no reset reaches the controller, as with a powered-off server).
        os.killpg(int((victim / "torchrun.pid").read_text()), signal.SIGKILL)
        subprocess.run(["ip", "link", "set", cluster.veths[1], "down"], check=True)
        code, summary = finish(proc, tmp_path)
    finally:
        stop_runs(node_dir)
    err = (tmp_path / "err.txt").read_text()
    assert code == 0, err[-3000:]
    rows = summary["rows"]
    failed = [r for r in rows if r["state"] == "FAIL"]
    assert len(failed) == 1, rows
    assert failed[0]["slot"] == "ns1"
    assert "no longer answers" in failed[0]["reason"]
    (retry,) = [r for r in rows if r["retry_of"] == failed[0]["number"]]
    assert retry["slot"] == "ns0"
    assert retry["params"] == failed[0]["params"]
    assert retry["state"] == "COMPLETE"
    assert sum(r["state"] == "COMPLETE" for r in rows) == 4  # the study completed
    assert "lost: ns1" in summary["notes"]


def wait_for_trial_on(node_dir: Path, host: str, cwd: Path, timeout: float = 120) -> Path:
    """The run directory of a trial training on ``host`` (its pid file written and a step logged)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pidfile in (node_dir / "runs").glob(f"tune-*/{host}/torchrun.pid"):
            run_id = pidfile.parent.parent.name
            logs = list((cwd / "runs" / "tune" / "sweep" / "trials" / run_id).glob("*.log"))
            if any("step 50/" in p.read_text() for p in logs):
                return pidfile.parent
        time.sleep(0.3)
    raise AssertionError(f"no trial on {host}: {(cwd / 'err.txt').read_text()[-2000:]}")


def test_a_bad_space_file_is_exit_2_with_a_line_per_problem(tmp_path):
    (tmp_path / "bad.toml").write_text(
        '[lr]\nlow = 1e-2\nhigh = 1e-3\n[layers]\nlow = 1\nhigh = 4\n[model]\nchoices = ["huge"]\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "provision", "tune", str(tmp_path / "missing-inventory.py"), "--space",
         str(tmp_path / "bad.toml"), "--trials", "4", "--", "--stop-file=/tmp/x", "--lr", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(lines) == 4, r.stderr
    assert any("--stop-file" in x and "the sweep sets it" in x for x in lines)  # it would turn pruning off
    assert any("lr" in x and "empty range" in x for x in lines)
    assert any("layers" in x and "not a flag" in x for x in lines)
    assert any("model" in x and "huge" in x for x in lines)
    assert "Traceback" not in r.stderr


def test_the_copy_runs_as_the_training_user_and_renames_into_place(tmp_path):
    node = SimpleNamespace(settings=SimpleNamespace(training_user="nobody-here-x"))
    src = tmp_path / "ck" / "tune-s-t3-step00000040.pt"
    src.parent.mkdir()
    src.write_bytes(b"weights")
    dest = tmp_path / "ck" / "tune-s"
    dest.mkdir()
    (dest / "best-step00000020.pt").write_bytes(b"older best")
    doc = '{"flags": {"lr": 0.001}, "note": "it\'s $(quoted)"}'
    cmd = results.copy_command(node, str(src), str(dest), 40, doc)  # type: ignore[arg-type]
    assert "runuser -u nobody-here-x" in cmd
    subprocess.run(["sh", "-c", cmd], check=True, timeout=30)  # no such user here: runs as this user
    assert (dest / "best-step00000040.pt").read_bytes() == b"weights"
    assert not (dest / "best-step00000020.pt").exists()
    assert (dest / "best.json").read_text() == doc + "\n"
    assert sorted(p.name for p in dest.iterdir()) == ["best-step00000040.pt", "best.json"]


def test_removing_trial_checkpoints_takes_only_this_studys_trial_files(tmp_path):
    """As the training user (none here: as this user), no subdirectory, no link followed:
    another study's files, the kept best and a link to a file elsewhere all stay."""
    node = SimpleNamespace(settings=SimpleNamespace(training_user="nobody-here-x"))
    ck, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    (ck / "tune-s.1").mkdir(parents=True)
    elsewhere.mkdir()
    gone = ["tune-s.1-t0-step00000040.pt", "tune-s.1-t12-step00000020.pt"]
    stay = ["tune-s.1-tb-t3-step00000040.pt", "tune-sx1-t3-step00000040.pt", "tune-s.1-t3-step00000040.pt.tmp",
            "train_ddp-step00000040.pt"]  # fmt: skip
    for name in gone + stay:
        (ck / name).write_bytes(b"w")
    (ck / "tune-s.1" / "best-step00000040.pt").write_bytes(b"best")
    (elsewhere / "precious").write_bytes(b"keep")
    (ck / "tune-s.1-t7-step00000040.pt").symlink_to(elsewhere / "precious")
    cmd = results.remove_trials_command(node, [str(ck), str(tmp_path / "missing dir")], "s.1")  # type: ignore[arg-type]
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert sorted(Path(line).name for line in r.stdout.splitlines()) == sorted(gone)
    assert sorted(p.name for p in ck.iterdir()) == sorted([*stay, "tune-s.1", "tune-s.1-t7-step00000040.pt"])
    assert (ck / "tune-s.1" / "best-step00000040.pt").read_bytes() == b"best"
    assert (elsewhere / "precious").read_bytes() == b"keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="running as another user needs root")
def test_removing_trial_checkpoints_as_the_training_user_from_a_directory_it_cannot_enter(tmp_path):
    """As root, the SSH user, from a working directory that only root may enter (root's home
    on a node): the training user (nobody here) removes its files and the command exits 0."""
    node = SimpleNamespace(settings=SimpleNamespace(training_user="nobody"))
    home = tmp_path / "root-home"  # under pytest's root-only directory: nobody cannot enter
    home.mkdir(mode=0o700)
    ck = Path(tempfile.mkdtemp(prefix="provision-test-ck-", dir="/tmp"))  # nobody's to write
    try:
        (ck / "tune-s-t0-step00000040.pt").write_bytes(b"w")
        for path in (ck, ck / "tune-s-t0-step00000040.pt"):
            os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)
        cmd = results.remove_trials_command(node, [str(ck)], "s")  # type: ignore[arg-type]
        r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=30, cwd=home)
        assert r.returncode == 0, r.stderr
        assert [Path(line).name for line in r.stdout.splitlines()] == ["tune-s-t0-step00000040.pt"]
        assert list(ck.iterdir()) == []
    finally:
        shutil.rmtree(ck)


def test_an_abbreviation_of_a_flag_the_sweep_sets_is_refused_too(tmp_path):
    # argparse took "--step 5" for --steps and "--stop-f" for --stop-file: the trainer no
    # longer takes abbreviations, and tune refuses them before any host.
    (tmp_path / "space.toml").write_text("[lr]\nlow = 1e-4\nhigh = 1e-2\n")
    r = subprocess.run(
        [sys.executable, "-m", "provision", "tune", str(tmp_path / "missing-inventory.py"), "--space",
         str(tmp_path / "space.toml"), "--trials", "2", "--", "--step", "5", "--stop-f=/tmp/x", "--summ", "y"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    said = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert [x.split(":")[1].strip() for x in said] == ["-- --steps", "-- --stop-file", "-- --summary"], said
    from training.train_ddp import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--step", "5"])
