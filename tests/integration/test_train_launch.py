"""`provision train` on two network-namespace hosts over real SSH: a run that trains, a
rank killed mid-run, Ctrl-C, and --resume. Each host runs real torchrun and gloo
all-reduce over its own veth; teardown is checked by the recorded pids and by scanning
/proc for any process whose command line carries the run id.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.launch import plan

RUN_TIMEOUT_S = 240  # a whole `provision train` call, bounded
CLEAN_WITHIN_S = 30  # the bound: every host clean this long after a failure
# Tiny and quick on 2 shared cores: 1 MiB of text, evaluation every 3 steps, one CPU thread
# a rank. The hosts' ranks share this machine's cores (and CI's e2e tier's VMs): torch's
# default, a thread a core, only makes each rank's threads spin-wait for each other.
TRAINER = ["--", "--data-max-mb", "1", "--eval-interval", "3", "--eval-samples", "8", "--threads", "1"]


@pytest.fixture(scope="module")
def hosts(netns_hosts, tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("node-train-dir")
    return netns_hosts(2, venv_path=sys.prefix, train_dir=str(node_dir)), node_dir


@pytest.fixture(autouse=True)
def no_run_outlives_its_test(hosts):
    """A test that failed may leave its run going; it would hold the rendezvous port and
    fail every later test. Stop what is left, by the process groups the runs recorded."""
    yield
    for pidfile in (hosts[1] / "runs").glob("*/*/torchrun.pid"):
        pgid = int(pidfile.read_text())
        if alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


def start(inventory: Path, cwd: Path, *args: str, preexec_fn=None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "provision",
        "train",
        str(inventory),
        "--runs-dir",
        str(cwd / "runs"),
        "--monitor-interval",
        "1",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=open(cwd / "out.txt", "w"),
        stderr=open(cwd / "err.txt", "w"),
        preexec_fn=preexec_fn,
    )


def finish(proc: subprocess.Popen, cwd: Path) -> tuple[int, dict]:
    code = proc.wait(timeout=RUN_TIMEOUT_S)
    (run,) = [p for p in (cwd / "runs").iterdir() if p.name.startswith("train-")]
    return code, json.loads((run / "report.json").read_text())


def why(cwd: Path, report: dict) -> str:
    """What a failed run said: the launcher's stderr, the report's failure, each host log's tail."""
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in Path(report["out_dir"]).glob("*.log"))
    return f"{(cwd / 'err.txt').read_text()[-2000:]}\nfailure: {report.get('failure')}\n{logs}"


def run_dir(cwd: Path, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [p for p in (cwd / "runs").glob("train-*") if p.is_dir()]
        if runs:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError(f"no run directory: {(cwd / 'err.txt').read_text()[-2000:]}")


def wait_for_steps(run: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in run.glob("*.log"):
            if f"step {step}/" in log.read_text():
                return
        time.sleep(0.3)
    raise AssertionError(f"no step {step} within {timeout}s")


def processes_of(run_id: str) -> dict[int, str]:
    """Every process whose command line carries the run id (torchrun: --rdzv-id, the
    workers: the run directory in the script path)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if run_id in cmdline:
                found[int(entry)] = cmdline
    return found


def wait_clean(run_id: str, since: float) -> dict[int, str]:
    while time.monotonic() < since + CLEAN_WITHIN_S:
        left = processes_of(run_id)
        if not left:
            return {}
        time.sleep(0.2)
    return processes_of(run_id)


def recorded_pids(node_dir: Path, run_id: str) -> list[int]:
    return [int(p.read_text()) for p in (node_dir / "runs" / run_id).glob("*/torchrun.pid")]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def worker(run_id: str, host: str) -> tuple[int, int]:
    """(pid, global rank) of the trainer process on a host."""
    for pid, cmdline in processes_of(run_id).items():
        if f"{run_id}/{host}/train_ddp.py" in cmdline and "torch.distributed.run" not in cmdline:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
            return pid, int(env["RANK"])
    raise AssertionError(f"no worker on {host}")


def test_two_hosts_train_together_and_exit_0(hosts, tmp_path):
    cluster, _node_dir = hosts
    code, report = finish(start(cluster.inventory, tmp_path, "--steps", "6", *TRAINER), tmp_path)
    assert code == 0, (tmp_path / "err.txt").read_text()[-3000:]
    assert report["ok"]
    assert report["world_size"] == 2
    nodes = {n["name"]: n for n in report["nodes"]}
    assert sorted(r for n in nodes.values() for r in n["ranks"]) == [0, 1]
    assert all(n["tokens_per_s"] > 0 and n["exited"] == 0 and n["clean"] for n in nodes.values())
    assert report["final_val_loss"] < 5.55  # below an untrained byte model's ln(256)
    run = Path(report["out_dir"])
    logs = {h: (run / f"{h}.log").read_text() for h in nodes}
    assert any("[rank0]:step 6/6 | train loss" in text for text in logs.values())
    assert (run / "train.png").stat().st_size > 10_000
    err = (tmp_path / "err.txt").read_text()
    assert "ns0 rank" in err or "ns1 rank" in err  # streamed live, prefixed by host and rank
    assert processes_of(report["run_id"]) == {}
    # rank 0's TensorBoard events, copied back beside the logs, read by TensorBoard's reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert report["tensorboard"] == str(run / "tensorboard")
    board = EventAccumulator(report["tensorboard"])
    board.Reload()
    train = board.Scalars("loss/train")
    assert train[-1].step == 6
    assert train[-1].value == pytest.approx(report["final_train_loss"], rel=1e-4)
    assert board.Scalars("loss/val")[-1].value == pytest.approx(report["final_val_loss"], rel=1e-4)


def test_a_killed_rank_stops_every_host_and_exits_1(hosts, tmp_path):
    cluster, node_dir = hosts
    proc = start(cluster.inventory, tmp_path, "--steps", "100000", *TRAINER)
    run = run_dir(tmp_path)
    wait_for_steps(run, 2)
    pid, rank = worker(run.name, "ns1")
    pgids = recorded_pids(node_dir, run.name)
    assert len(pgids) == 2
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    left = wait_clean(run.name, killed_at)
    code, report = finish(proc, tmp_path)
    assert left == {}, f"left after {CLEAN_WITHIN_S}s: {left}"
    assert not any(alive(p) for p in pgids)
    assert code == 1
    assert report["failed_host"] == "ns1"
    assert report["failed_rank"] == rank
    assert "killed by signal 9" in report["failure"]
    assert all(n["clean"] for n in report["nodes"])
    out = (tmp_path / "out.txt").read_text()
    assert f"ns1 rank {rank} failed first" in out


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# SIGINT with SIGINT ignored at start, as a shell's background job gets it (the launcher must
# install its own handler), and SIGTERM, as a scheduler or `kill` sends it.
@pytest.mark.parametrize(
    ("sig", "said"),
    [(signal.SIGINT, "interrupted (Ctrl-C)"), (signal.SIGTERM, "stopped by SIGTERM")],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_or_sigterm_stops_every_host_and_exits_1(hosts, tmp_path, sig, said):
    cluster, node_dir = hosts
    proc = start(cluster.inventory, tmp_path, "--steps", "100000", *TRAINER, preexec_fn=_ignore_sigint)
    run = run_dir(tmp_path)
    wait_for_steps(run, 2)
    pgids = recorded_pids(node_dir, run.name)
    assert len(pgids) == 2
    assert all(alive(p) for p in pgids)
    proc.send_signal(sig)
    sent_at = time.monotonic()
    left = wait_clean(run.name, sent_at)
    code, report = finish(proc, tmp_path)
    assert left == {}, f"left after {CLEAN_WITHIN_S}s: {left}"
    assert not any(alive(p) for p in pgids)
    assert code == 1
    assert said in report["failure"]
    assert all(n["clean"] for n in report["nodes"])


def test_resume_continues_from_the_checkpoint_step(hosts, tmp_path):
    cluster, _node_dir = hosts
    (tmp_path / "first").mkdir()
    (tmp_path / "again").mkdir()
    code, first = finish(start(cluster.inventory, tmp_path / "first", "--steps", "4", *TRAINER), tmp_path / "first")
    assert code == 0, why(tmp_path / "first", first)
    code, again = finish(
        start(cluster.inventory, tmp_path / "again", "--steps", "6", "--resume", *TRAINER), tmp_path / "again"
    )
    assert code == 0, (tmp_path / "again" / "err.txt").read_text()[-3000:]
    text = "\n".join(p.read_text() for p in Path(again["out_dir"]).glob("*.log"))
    assert "resumed from" in text
    assert "at step 4" in text
    steps = [int(line.split("step ")[1].split("/")[0]) for line in text.splitlines() if "| train loss" in line]
    assert steps == [5, 6]


def sshd_sessions(listener: int) -> list[int]:
    """The per-connection sshd processes under a host's listening sshd (not what they run)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], list(children.get(listener, []))
    while todo:
        pid = todo.pop()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "sshd":
            found.append(pid)
            todo += children.get(pid, [])
    return found


def test_a_lost_ssh_connection_stops_every_host_and_exits_1(hosts, tmp_path):
    """Drop the controller's SSH connection to ns1 (kill its sshd session processes): the
    trainer there keeps running in its own session, so the launcher must reconnect to
    stop it, and stop ns0 too."""
    cluster, _node_dir = hosts
    proc = start(cluster.inventory, tmp_path, "--steps", "100000", *TRAINER)
    run = run_dir(tmp_path)
    wait_for_steps(run, 2)
    sessions = sshd_sessions(cluster.hosts[1].sshd.pid)
    assert sessions
    for pid in sessions:
        os.kill(pid, signal.SIGKILL)
    left = wait_clean(run.name, time.monotonic())
    code, report = finish(proc, tmp_path)
    assert left == {}, f"left after {CLEAN_WITHIN_S}s: {left}"
    assert code == 1
    assert report["failed_host"] == "ns1"
    assert "ns1: SSH connection lost" in report["failure"]
    assert all(n["clean"] for n in report["nodes"])


def test_as_root_the_trainer_runs_as_the_training_user(netns_hosts, tmp_path):
    # Over SSH as root, with the training account present (here: nobody, which every
    # Linux has), the ranks run as that account: root_squash would refuse root on the NFS
    # shares. Its files (checkpoints, token cache) belong to it. The node directory is
    # outside pytest's 0700 tmp tree so the account can reach it.
    import pwd
    import shutil
    import sysconfig
    import tempfile

    node_dir = Path(tempfile.mkdtemp(prefix="provision-it-runas-", dir="/var/tmp"))
    node_dir.chmod(0o755)
    # The account must be able to run the venv's interpreter; this project's venv may point
    # into a private home (pyenv under /root), so give it a venv of the system's Python of
    # the same version that sees the project venv's packages (torch) through a .pth file.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system_python = Path(f"/usr/bin/python{version}")
    if not system_python.exists():
        pytest.skip(f"no system python{version} for the training account to run")
    venv = node_dir / "venv"
    subprocess.run([str(system_python), "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "lib" / f"python{version}" / "site-packages" / "project.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    try:
        cluster = netns_hosts(2, venv_path=str(venv), train_dir=str(node_dir), training_user="nobody")
        code, report = finish(start(cluster.inventory, tmp_path, "--steps", "4", *TRAINER), tmp_path)
        assert code == 0, why(tmp_path, report)
        assert report["world_size"] == 2
        assert all(n["clean"] for n in report["nodes"])
        checkpoints = list((node_dir / "work" / "checkpoints").glob("*.pt"))
        assert checkpoints, sorted(str(p) for p in node_dir.rglob("*"))[:50]
        assert {pwd.getpwuid(p.stat().st_uid).pw_name for p in checkpoints} == {"nobody"}
        assert processes_of(report["run_id"]) == {}
        # Root runs the reaper from the run directory and signals the pid in its run file:
        # all of it stays root's, and the training user can change none of it.
        run_dir = node_dir / "runs" / report["run_id"] / "ns1"
        for path in (node_dir, run_dir, run_dir / "reaper.py", run_dir / plan.RUN_FILE):
            assert path.stat().st_uid == 0, path
            assert not path.stat().st_mode & 0o022, path
        for attempt in (
            f"echo 1 > {run_dir}/{plan.RUN_FILE}",
            f"echo 'import os' > {run_dir}/reaper.py",
            f"mv {run_dir}/reaper.py {run_dir}/torchrun-logs/",
            f"ln -s /etc/passwd {run_dir}/json.py",
            f"mv {node_dir}/runs {node_dir}/work/",
        ):
            tried = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", attempt], capture_output=True)
            assert tried.returncode != 0, attempt
    finally:
        shutil.rmtree(node_dir, ignore_errors=True)


def test_the_node_check_finds_torch_without_importing_it():
    """The check each node runs before a launch (session._python_check): exit 0 where the
    python has torch, 1 where it has none (the same python without its site-packages), and torch is
    never imported by it: the import costs a minute on an emulated or busy node, and
    torchrun pays it moments later anyway."""
    from provision.launch import session

    check = session._python_check(True)
    assert subprocess.run([sys.executable, "-c", check], timeout=60).returncode == 0
    assert subprocess.run([sys.executable, "-I", "-S", "-c", check], timeout=60).returncode == 1
    imported = subprocess.run(
        [sys.executable, "-c", f"{check.replace('sys.exit', 'print')}; print('torch' in sys.modules)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert imported.stdout.split() == ["False", "False"], imported.stdout + imported.stderr
