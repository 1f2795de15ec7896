"""The training reaper, run-as probe and node directories run for real: process groups,
sessions, markers, owners and modes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision.launch import plan, reaper, session
from tests.unit.test_launch import spawn_fake_run


def test_the_run_as_probe_names_the_user_only_for_root_and_an_existing_account(tmp_path):

    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run(["sh", "-c", plan.run_as_probe(me)], capture_output=True, text=True).stdout
    assert out.strip() == (f"RUN_AS={me}" if os.geteuid() == 0 else "")
    missing = subprocess.run(
        ["sh", "-c", plan.run_as_probe("no-such-user-provision")], capture_output=True, text=True
    ).stdout
    assert missing == ""


def test_reaper_stops_the_group_and_workers_in_their_own_sessions(tmp_path, capsys):
    proc, run_dir = spawn_fake_run(tmp_path, "run-x", "n0")
    root = int((run_dir / "torchrun.pid").read_text())
    found = reaper.targets(root, "run-x", "n0")
    assert root in found
    assert len(found) >= 3
    assert reaper.main([str(run_dir), "run-x", "n0", "--grace", "2"]) == 0
    proc.wait(timeout=10)
    result = json.loads(capsys.readouterr().out)
    assert result["left"] == []
    assert set(result["signalled"]) >= found
    assert not reaper.alive(found)


def test_reaper_finds_strays_by_run_marker_when_the_run_file_is_gone(tmp_path, capsys):
    proc, run_dir = spawn_fake_run(tmp_path, "run-y", "n1")
    (run_dir / "torchrun.pid").unlink()
    os.kill(int(proc.pid), signal.SIGKILL)  # torchrun gone: its children are orphans now
    proc.wait(timeout=10)
    assert reaper.targets(None, "run-y", "n1"), "orphans carry the run marker"
    assert reaper.targets(None, "run-y", "other-node") == set()
    assert reaper.main([str(run_dir), "run-y", "n1", "--grace", "2"]) == 0
    assert reaper.targets(None, "run-y", "n1") == set()


def write_run_file(run_dir: Path, text: str, mode: int = 0o644) -> Path:
    run_dir.mkdir(exist_ok=True)
    path = run_dir / plan.RUN_FILE
    path.write_text(text)
    path.chmod(mode)
    return path


def test_reaper_leaves_a_process_without_the_run_id_alone_even_when_the_run_file_names_it(tmp_path, capsys):
    stranger = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"]})
    try:
        write_run_file(tmp_path / "n0", str(stranger.pid))
        assert reaper.main([str(tmp_path / "n0"), "run-s", "n0", "--grace", "1"]) == 0
        assert json.loads(capsys.readouterr().out)["signalled"] == []
        assert stranger.poll() is None, "a process that is not the run's was signalled"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("text", ["1", "0", "-1", f"-{os.getpid()}", "", "garbage", "1\n2"])
def test_reaper_reads_no_pid_from_a_run_file_naming_init_zero_a_group_or_garbage(tmp_path, text):
    # targets() only looks; nothing here is signalled even if a guard were missing.
    path = write_run_file(tmp_path / "n0", text)
    assert reaper.read_pid(str(path)) is None
    assert reaper.targets(1, "run-t", "n0") == set()


def test_reaper_believes_a_run_file_only_when_it_is_the_reapers_own_and_no_one_else_can_write_it(tmp_path):
    proc, run_dir = spawn_fake_run(tmp_path, "run-w", "n0")
    try:
        path = run_dir / plan.RUN_FILE
        pid = int(path.read_text())
        path.chmod(0o644)
        assert reaper.read_pid(str(path)) == pid
        path.chmod(0o666)  # another user could have written it
        assert reaper.read_pid(str(path)) is None
        path.chmod(0o644)
        os.chown(path, 65534, 65534)  # nobody's file
        assert reaper.read_pid(str(path)) is None
        link = run_dir / "link.pid"
        link.symlink_to(path)
        assert reaper.read_pid(str(link)) is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reaper.main([str(run_dir), "run-w", "n0", "--grace", "1"])


NOBODY = 65534


def node_dirs(train_dir: Path, run_as: bool = True) -> str:
    """node_dirs_command as the probe runs it (root here), for run r1 on node n0."""
    cmd = plan.node_dirs_command(str(train_dir), f"{train_dir}/runs/r1/n0", "nobody")
    env = {**os.environ, "RUN_AS": "RUN_AS=nobody" if run_as else ""}
    return subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True).stdout.strip()


def owner_mode(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return st.st_uid, st.st_mode & 0o7777


def test_node_dirs_keep_the_run_directory_roots_and_give_the_user_only_work_and_logs(tmp_path):
    t = tmp_path / "train"
    (t / "work" / "checkpoints").mkdir(parents=True)
    (t / "work" / "checkpoints" / "old.pt").write_text("root's")
    assert node_dirs(t) == "DIRS_OK"
    run = t / "runs" / "r1" / "n0"
    assert owner_mode(t) == (0, 0o755)
    assert owner_mode(run) == (0, 0o755)
    assert owner_mode(t / "runs") == (0, 0o755)
    assert owner_mode(run / "torchrun-logs") == (NOBODY, 0o755)
    assert owner_mode(t / "work") == (NOBODY, 0o755)
    assert owner_mode(t / "work" / "checkpoints" / "old.pt")[0] == 0  # not recursive
    # The same run id twice: the run directory must be fresh.
    assert node_dirs(t) != "DIRS_OK"


def test_nodes_sharing_a_train_dir_make_it_side_by_side(tmp_path):
    """Two nodes on one filesystem (an NFS train_dir; in tests, two namespaces of one
    machine) run the probe at the same moment: both get their directories. A check-then-
    mkdir of the work directory failed one of them with "File exists" now and then."""
    for k in range(20):
        t = tmp_path / f"train{k}"
        cmds = [plan.node_dirs_command(str(t), f"{t}/runs/r1/n{i}", "nobody") for i in (0, 1)]
        env = {**os.environ, "RUN_AS": "RUN_AS=nobody"}
        procs = [subprocess.Popen(["sh", "-c", c], env=env, stdout=subprocess.PIPE, text=True) for c in cmds]
        assert [p.communicate(timeout=30)[0].strip() for p in procs] == ["DIRS_OK", "DIRS_OK"], k


def test_node_dirs_without_a_training_user_hand_nothing_over(tmp_path):
    assert node_dirs(tmp_path / "train", run_as=False) == "DIRS_OK"
    assert owner_mode(tmp_path / "train" / "work") == (0, 0o755)
    assert owner_mode(tmp_path / "train" / "runs" / "r1" / "n0" / "torchrun-logs") == (0, 0o755)


def test_node_dirs_refuse_a_train_dir_another_user_made_first(tmp_path):
    t = tmp_path / "train"
    t.mkdir(mode=0o755)
    os.chown(t, NOBODY, NOBODY)
    assert node_dirs(t) == f"{t} is owned by uid {NOBODY}"
    assert not (t / "runs").exists()


def test_node_dirs_refuse_a_train_dir_others_can_write(tmp_path):
    t = tmp_path / "train"
    t.mkdir()
    t.chmod(0o1777)  # even sticky: the run directory would sit in it
    assert node_dirs(t) == f"{t} is writable by group or others"


def test_node_dirs_refuse_a_parent_others_can_write_unless_it_is_sticky(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    assert node_dirs(parent / "train") == f"{parent} is writable by group or others"
    parent.chmod(0o1777)  # like /var/tmp
    assert node_dirs(parent / "train") == "DIRS_OK"


def test_node_dirs_refuse_a_link_another_user_owns_or_one_to_their_directory(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY, NOBODY)
    link = tmp_path / "train"
    link.symlink_to(theirs)
    assert node_dirs(link) == f"{theirs} is owned by uid {NOBODY}"
    os.lchown(link, NOBODY, NOBODY)
    assert node_dirs(link) == f"{link} is owned by uid {NOBODY}"


@pytest.mark.parametrize(
    ("sig", "said"),
    [(signal.SIGINT, "interrupted (Ctrl-C)"), (signal.SIGTERM, "stopped by SIGTERM")],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stop_signal_ends_the_watch_while_other_threads_hold_the_interpreter(tmp_path, sig, said):
    """Threads are gevent greenlets here, as in the CLI. A handler runs in whichever greenlet
    holds the interpreter when the signal lands: one that raised ended a busy thread or was
    printed by the hub and dropped, and the run went on (CI: Ctrl-C ignored for 240 s).
    The watch must see the request however busy the other threads are."""
    node = plan.NodePlan("n0", "10.0.0.1", "eth0", "python3", 1, str(tmp_path), str(tmp_path), True)
    run = plan.RunPlan("train-x", "10.0.0.1", 29500, (node,), ())
    opts = session.Options(
        steps=1,
        model="tiny",
        nproc_per_node=None,
        batch_per_rank=1,
        resume=False,
        extra_args=(),
        python=None,
        runs_dir=tmp_path,
        monitor_interval=1,
        timeout_s=20,  # the watch's own limit: the failure says which ended it
        ckpt_name="c.pt",
    )
    sup = session.Supervisor([SimpleNamespace(name="n0")], {}, run, opts, lambda *_: None)
    done = threading.Event()

    def busy() -> None:  # a log stream or an SSH reader: wakes often, never ends by itself
        while not done.is_set():
            time.sleep(0.001)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
    threads.append(threading.Thread(target=lambda: (time.sleep(0.5), os.kill(os.getpid(), sig)), daemon=True))
    for t in threads:
        t.start()
    try:
        with session.stop_signals() as stop:
            sup._watch(stop)
    finally:
        done.set()
    assert sup.out.failure == said
    assert sup.out.failed_host is None
