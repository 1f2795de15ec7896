"""`provision train` on the provisioned testbed, one drill: an elastic run (`--min-nodes 1`,
a checkpoint every 10 steps) trains on both VMs over the cluster network with checkpoints
on NFS, loses one VM mid-run and goes on with the other from its newest checkpoint, to the
last step and exit 0, with the losses of a 1-rank run from that checkpoint. Then
`--resume`, as a Slurm job (the default scheduler on a cluster running Slurm), continues
from that run's last checkpoint to a clean exit and a COMPLETED job, and with `--requeue`
is followed across a requeue into a second attempt that resumes from the run's newer
checkpoint. As the training user, nothing root runs or believes can be changed.

A lost node tearing down a run that is not elastic, within 30 s on every host, is tested
on network-namespace hosts (tests/integration/test_train_launch.py: a killed rank, a lost
SSH connection), where it costs seconds instead of a TCG trainer launch."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from provision import inventory, remote
from provision.rules import monitoring
from tests.e2e.prometheus_helpers import query
from tests.e2e.storage_helpers import sh
from tests.helpers.train_logs import train_losses

# Small enough for TCG guests: 2 sequences a rank a step (a step at 8 took 2 s on one VM and
# up to 7 s across two), 1 MiB of text; the Slurm run checkpoints every 2 steps.
BATCH = ["--batch-per-rank", "2"]
TRAINER = ["--", "--data-max-mb", "1", "--eval-interval", "4", "--eval-samples", "8", "--ckpt-interval", "2"]


def start(inv: Path, cwd: Path, *args: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "provision",
        "train",
        str(inv),
        "--runs-dir",
        str(cwd / "runs"),
        "--timeout",
        "1500",
        *args,
    ]
    with open(cwd / "out.txt", "w") as out, open(cwd / "err.txt", "w") as err:
        return subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=dict(os.environ))


def report_of(cwd: Path) -> dict:
    (run,) = [p for p in (cwd / "runs").iterdir() if p.name.startswith("train-")]
    return json.loads((run / "report.json").read_text())


def trainer_processes(node, run_id: str) -> list[str]:
    """Processes on a node whose command line carries the run id."""
    out = remote.run(node, f"pgrep -af -- {run_id} || true", timeout=30).stdout
    return [line for line in out.splitlines() if line.strip() and "pgrep" not in line]


@pytest.mark.takes_s(1300)  # CI's run of stop 42: 1,246 s
@pytest.mark.destructive
def test_two_vms_train_elastically_lose_one_and_a_slurm_resume_with_requeue_continues(provisioned, testbed, tmp_path):
    # One drill carries the training checks: under TCG every run of the trainer costs
    # minutes (torch's import alone is 90 s per host). The elastic run is the two-VM run
    # over the cluster network and NFS, then the VM death; the resumed run, a complete
    # two-VM run to exit 0, continues from its checkpoint.
    cluster = inventory.load(testbed.inventory_path)
    survivor, victim = cluster.nodes[0], cluster.nodes[-1]
    first_run = _elastic_drill(testbed, cluster, survivor, victim, tmp_path / "elastic")

    # The resumed run goes through Slurm, the default (--scheduler auto) where the slurm step
    # provisioned every host: one job on both VMs, the same live logs and report, the
    # checkpoint on NFS that the elastic (SSH) run wrote, COMPLETED in Slurm.
    # And --requeue: once this run has checkpointed, the job is requeued by hand (as an admin,
    # or a preemption, would); the run follows it into its second attempt, which resumes from
    # this run's newest checkpoint. Slurm holds a requeued job back a while before it starts
    # it again; the run waits through that as one run.
    (tmp_path / "again").mkdir()
    resumed = start(
        Path(testbed.inventory_path), tmp_path / "again", "--steps", str(RESUMED_STEPS), "--resume", "--requeue",
        *BATCH, *TRAINER,
    )  # fmt: skip
    head = cluster.head_node()[0]
    said = (tmp_path / "again" / "err.txt").read_text
    watcher = _LiveWatcher(monitoring.prometheus_node(cluster))
    try:
        text = _wait_for_text(tmp_path / "again", "checkpoint step ")  # rank 0's line, after the save
        job = re.search(r"\[provision\] Slurm job (\d+) started \(attempt 1\)", text)
        assert job, text[-2000:]
        sh(head, f"scontrol requeue {job[1]}")
        code = resumed.wait(timeout=1800)
    finally:
        if resumed.poll() is None:  # Ctrl-C: the run cancels its job and cleans the nodes
            resumed.send_signal(signal.SIGINT)
            resumed.wait(timeout=300)
        watcher.stop()
    assert code == 0, said()[-3000:]
    assert "scheduler: slurm" in said(), said()[:2000]
    report = report_of(tmp_path / "again")
    _live_and_tensorboard(report, watcher, (tmp_path / "again" / "out.txt").read_text())
    assert report["world_size"] == 2
    assert all(n["tokens_per_s"] > 0 and n["clean"] for n in report["nodes"]), report["nodes"]
    assert report["requeues"] == 1, report
    node_logs = {p.stem: p.read_text() for p in Path(report["out_dir"]).glob("*.log")}
    for name, text in node_logs.items():
        assert f"[provision] Slurm job {job[1]} started (attempt 2)" in text, name
    logs = "\n".join(node_logs.values())
    # Resumed twice: from the elastic run's last checkpoint, then (attempt 2) from this run's newer one.
    resumed_at = [int(n) for n in re.findall(r"resumed from \S+ at step (\d+)", logs)]
    assert min(resumed_at) == ELASTIC_STEPS, resumed_at
    assert len(set(resumed_at)) >= 2, resumed_at
    steps = [int(line.split("step ")[1].split("/")[0]) for line in logs.splitlines() if "| train loss" in line]
    assert min(steps) == ELASTIC_STEPS + 1, steps  # nothing before the checkpoint trained again
    assert max(steps) == RESUMED_STEPS, steps
    assert f"ran as Slurm job {job[1]}" in report["notes"]
    shown = sh(head, f"scontrol show job {job[1]} -o")
    assert "JobState=COMPLETED" in shown, shown
    assert "Restarts=1" in shown, shown
    _privilege_drill(survivor, first_run)


class _LiveWatcher:
    """Asks Prometheus on the head for the running job's step every few seconds while the
    run goes on (a thread: the run's own waits go on undisturbed); keeps what it saw."""

    def __init__(self, head) -> None:
        self.head, self.seen, self.errors = head, {}, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(5):
            try:
                for s in query(self.head, "provision_train_step"):
                    run, node = s["metric"].get("run"), s["metric"].get("node")
                    self.seen[(run, node)] = max(self.seen.get((run, node), 0), float(s["value"][1]))
            except (AssertionError, ValueError, KeyError) as e:  # a slow answer: the next poll
                self.errors.append(str(e)[:200])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


def _live_and_tensorboard(report: dict, watcher: _LiveWatcher, printed: str) -> None:
    """The run's figures reached Prometheus while it trained (rank 0's node's textfile,
    written by the controller), and its TensorBoard events came back beside its logs with
    the losses the report has."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = {node: step for (run, node), step in watcher.seen.items() if run == report["run_id"]}
    assert steps, (watcher.seen, watcher.errors[-3:])
    assert max(steps.values()) > ELASTIC_STEPS, watcher.seen  # this run's steps, not the last run's
    assert report["tensorboard"], report["notes"]
    assert f"tensorboard --logdir {report['tensorboard']}" in printed
    board = EventAccumulator(report["tensorboard"])
    board.Reload()
    train = board.Scalars("loss/train")
    assert train[-1].step == RESUMED_STEPS
    assert train[-1].value == pytest.approx(report["final_train_loss"], rel=1e-4)


ELASTIC_CKPT_EVERY = 10  # the interval for the recovery figure (BENCHMARKS, issue 17)
ELASTIC_KILL_AFTER = 11  # a step past the checkpoint: the least TCG time for a restart from it
# Steps to spare after the kill's: it landed at step 12 or 13 in session 43's runs (about
# 2.8 s a step at world 2), and a run that ended first would have lost nothing.
ELASTIC_STEPS = 20
DATA_MB = 1  # MiB of text the trainer reads
ELASTIC_TRAINER = ["--", "--data-max-mb", str(DATA_MB), "--eval-interval", "4", "--eval-samples", "8"]
# From the elastic run's last checkpoint (20), a checkpoint every 2 steps: the requeue
# lands after the first (at step 23 or 24 in the runs so far), with steps to spare.
RESUMED_STEPS = 30


def _elastic_drill(testbed, cluster, survivor, victim, cwd: Path) -> str:
    """`--min-nodes 1`, a checkpoint every 10 steps: the victim's VM is killed (SIGKILL to
    qemu: its ranks' peers hear nothing more on the cluster network) once step 11 is seen,
    the world-2 checks done at the step-10 checkpoint; the launcher stops the survivor's
    workers, torchrun restarts them alone from step 10 (the rendezvous store is on the
    controller), and the run ends 0 naming the victim. The victim is started again
    afterwards, for the Slurm run after this one and the tests after. Returns the run id.
    A lost VM admitted again during the run (the world going 2, 1, 2) costs the tier
    minutes more under TCG: benchmarks/train_elastic_testbed.py does that on the testbed,
    and tests/integration/test_train_elastic.py on namespace hosts."""
    cwd.mkdir()
    proc = start(
        Path(testbed.inventory_path), cwd, "--min-nodes", "1", "--steps", str(ELASTIC_STEPS),
        "--ckpt-every", str(ELASTIC_CKPT_EVERY), *BATCH, *ELASTIC_TRAINER,
    )  # fmt: skip
    said = (cwd / "err.txt").read_text
    try:
        # The checks take SSH round trips to TCG guests while the run trains: done before
        # the kill's step, so they never delay the kill toward the run's end.
        _wait_for_text(cwd, f"checkpoint step {ELASTIC_CKPT_EVERY} ")
        _at_world_2(cluster, survivor, victim)
        run = _wait_for_checkpointed_step(cwd, step=ELASTIC_KILL_AFTER)
        testbed.testbed.stop_node(victim.name, hard=True)
        code = proc.wait(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=300)
        testbed.testbed.start_node(victim.name)
    assert code == 0, said()[-3000:]
    assert "scheduler: ssh (an elastic run" in said()
    report = report_of(cwd)
    print(json.dumps({"lost": report["lost"], "restarts": report["restarts"]}, indent=1))
    assert report["ok"] is True, report.get("failure")
    assert [x["host"] for x in report["lost"]] == [victim.name]
    text = (Path(report["out_dir"]) / f"{survivor.name}.log").read_text()
    restart, *again = report["restarts"]
    assert restart["lost"] == [victim.name]
    assert (restart["world_before"], restart["world_after"]) == (2, 1)
    assert restart["resumed_from_step"] == ELASTIC_CKPT_EVERY, restart
    assert restart["steps_recomputed"] >= ELASTIC_KILL_AFTER - ELASTIC_CKPT_EVERY, restart
    # Once, in a clean-clone CI run beside the other tiers, the survivor's workers were
    # started a second time, alone, two minutes after the first restart and before its
    # first step. The run still finished; what torchrun said is printed for the next one.
    if again:
        print("\n".join(line for line in text.splitlines() if not line.startswith("[rank0]:step")))
    assert all((r["world_before"], r["world_after"], r["lost"]) == (1, 1, []) for r in again), again
    assert all(r["resumed_from_step"] >= restart["resumed_from_step"] for r in again), again
    assert (again[-1] if again else restart)["recovery_s"] is not None
    steps = [int(line.split("step ")[1].split("/")[0]) for line in text.splitlines() if "| train loss" in line]
    assert max(steps) == ELASTIC_STEPS
    assert "world size 2 -> 1, global batch" in text
    _losses_match_one_rank_from_the_checkpoint(survivor, text, cwd / "reference")
    assert trainer_processes(survivor, run) == []
    # After its new boot nothing of the run came back.
    assert trainer_processes(_now(testbed, victim), run) == []
    return run


def _losses_match_one_rank_from_the_checkpoint(survivor, text: str, where: Path) -> None:
    """After the restart the survivor's losses equal, within 1e-4, those of an uninterrupted
    1-rank run from the same checkpoint with the same global batch (2 sequences a rank x 2
    ranks). The reference runs here on the controller's CPU, in seconds where a TCG guest
    takes minutes, from the checkpoint and token files the survivor read on NFS."""
    where.mkdir()
    resumed = re.search(r"resumed from (\S+) at step (\d+)", text)
    data = re.search(r"data (/\S+): [\d,]+ train", text)
    assert resumed, text[-2000:]
    assert data, text[-2000:]
    path, step = resumed[1], int(resumed[2])
    ckpt_dir, name = where / "checkpoints", Path(path).name.rsplit("-step", 1)[0]
    ckpt_dir.mkdir()
    _fetch(survivor, path, ckpt_dir / Path(path).name)  # only this one: --resume takes the newest
    # The token files where the trainer looks for them given the survivor's --data: its cache
    # directory is named by a hash of the text's path, the MiB read and the validation share.
    tokens = f"{survivor.settings.nfs_mount_root}/datasets/train_ddp"
    key = hashlib.sha1(f"{data[1]}|{DATA_MB}|0.1".encode()).hexdigest()[:12]
    (where / "data" / key).mkdir(parents=True)
    for file in ("train.bin", "val.bin", "meta.json"):
        _fetch(survivor, f"{tokens}/{key}/{file}", where / "data" / key / file)
    from provision.resources import training_script

    ref = subprocess.run(
        [
            sys.executable, str(training_script()), "--steps", str(ELASTIC_STEPS), "--global-batch", "4",
            "--micro-batch", "2", "--resume", "--ckpt-dir", str(ckpt_dir), "--ckpt-name", name,
            "--ckpt-interval", "0", "--data", data[1], "--data-cache", str(where / "data"),
            "--threads", "1", *ELASTIC_TRAINER[1:],
        ],
        cwd=where, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    said = ref.stdout + ref.stderr
    assert ref.returncode == 0, said[-2000:]
    assert f"at step {step}" in said, said[-2000:]
    # The survivor's tokens, found under their key: the trainer made no cache of its own.
    assert [d.name for d in (where / "data").iterdir()] == [key], said[-2000:]
    reference, elastic = train_losses(said), train_losses(text, rank0_only=True)
    compared = {s: (elastic.get(s), v) for s, v in reference.items() if s > step}
    print("losses after the restart (survivor, 1-rank reference):", compared)
    assert len(compared) == ELASTIC_STEPS - step, compared
    for s, (got, want) in compared.items():
        assert got is not None, (s, compared)
        assert abs(got - want) <= 1e-4, (s, got, want)


def _fetch(node, path: str, dest: Path) -> None:
    """A file from a node (root reads it; base64 keeps the bytes whole through the shell)."""
    dest.write_bytes(base64.b64decode(sh(node, f"base64 -w0 {shlex.quote(path)}")))


def _at_world_2(cluster, survivor, victim) -> None:
    """While both VMs train: the victim's ranks talk to the survivor's cluster address (the
    gloo peers), not to anything on the SSH (management) side, and the checkpoints are on
    NFS, where the client sees them under its mount."""
    sockets = sh(victim, "ss -tnH state established")
    peers = {line.split()[-1].rsplit(":", 1)[0] for line in sockets.splitlines() if line.strip()}
    assert survivor.cluster_address in peers, sockets
    server = cluster.storage_node()
    client = next(n for n in cluster.nodes if n.name != server.name)
    listing = sh(client, f"ls {client.settings.nfs_mount_root}/checkpoints")
    assert ".pt" in listing, listing


def _now(testbed, node):
    """``node`` as the testbed's inventory has it now: a VM booted again gets a new SSH port
    when its old one was taken meanwhile."""
    return next(n for n in inventory.load(testbed.inventory_path).nodes if n.name == node.name)


def _wait_for_text(cwd: Path, needle: str, timeout: float = 900) -> str:
    """The run's node logs, once one of them holds ``needle``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run in [p for p in (cwd / "runs").glob("train-*") if p.is_dir()]:
            text = "\n".join(log.read_text() for log in run.glob("*.log"))
            if needle in text:
                return text
        time.sleep(1)
    raise AssertionError(f"no {needle!r} within {timeout}s: {(cwd / 'err.txt').read_text()[-2000:]}")


def _privilege_drill(node, run_id: str) -> None:
    """As the training user, after a run: try to reach root through what root later runs
    (the reaper, the trainer) or believes (the pid file it signals): every attempt fails."""
    s = node.settings
    runs = f"{s.train_dir}/runs"
    run_dir = f"{runs}/{run_id}/{node.name}"
    for name in ("torchrun.pid", "reaper.py", "train_ddp.py"):
        owner, mode = sh(node, f"stat -c '%U %a' {run_dir}/{name}").split()
        assert owner == "root", (name, owner)
        assert int(mode, 8) & 0o022 == 0, (name, mode)
    attempts = {
        "name pid 1 in the pid file": f"echo 1 > {run_dir}/torchrun.pid",
        "replace the reaper": f"echo 'import os' > {run_dir}/reaper.py",
        "append to the trainer": f"echo 'import os' >> {run_dir}/train_ddp.py",
        "add a file to the run directory": f"touch {run_dir}/planted",
        "move the run directory away": f"mv {run_dir} {run_dir}.old",
        "plant a link beside it": f"ln -s /etc {runs}/{run_id}/planted",
        "add a run of its own": f"mkdir {runs}/planted",
    }
    for what, command in attempts.items():
        tried = remote.run(node, f"runuser -u {s.training_user} -- sh -c {shlex.quote(command)}", timeout=60)
        assert not tried.ok, f"the training user could {what}: {command}"
    # A pid file the training user wrote itself, naming pid 1: root's reaper believes it not.
    fake = f"/home/{s.training_user}/fake-run"
    sh(node, f"runuser -u {s.training_user} -- sh -c 'mkdir -p {fake} && echo 1 > {fake}/torchrun.pid'")
    verdict = json.loads(sh(node, f"python3 -I {run_dir}/reaper.py {fake} {run_id} {node.name} --check"))
    assert verdict == {"pgid": None, "signalled": [], "left": []}, verdict


def _wait_for_checkpointed_step(cwd: Path, step: int, timeout: float = 900) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [p for p in (cwd / "runs").glob("train-*") if p.is_dir()]
        for run in runs:
            if any(f"step {step}/" in log.read_text() for log in run.glob("*.log")):
                return run.name
        time.sleep(1)
    raise AssertionError(f"no step {step} within {timeout}s: {(cwd / 'err.txt').read_text()[-2000:]}")
