"""Users' own jobs on the provisioned testbed (a Slurm cluster with NFS shares):

- PyTorch's standard pattern with no provision command, as the training user: an sbatch of
  2 nodes, `srun torchrun --rdzv-backend c10d` on a small DDP script over gloo. It runs
  with no interface set by hand (the task prolog gives each task its node's cluster NIC),
  and a rank that fails ends the step at once (KillOnBadExit) instead of leaving its peer
  waiting until the time limit.
- `provision run` with a task written here (tests/helpers/user_job.py), through Slurm and
  again over SSH: a requirements file of a wheel the job ships beside the frameworks
  wheelhouse, metrics, a saved model copied back; the second run reuses the env; `runs`
  lists it and `logs` shows it. The SSH run's task is SkyPilot's minGPT-ddp `run` block
  (skypilot-org/skypilot, docs/source/running-jobs/distributed-jobs.rst), adapted only to
  run on CPU: one process a node instead of $SKYPILOT_NUM_GPUS_PER_NODE, our script in
  place of the minGPT checkout (the nodes reach no GitHub).
- `cancel` of a detached job leaves no process of it on any node.
"""

from __future__ import annotations

import secrets
import shlex
import time
from pathlib import Path

import pytest

from provision import inventory
from tests.e2e.storage_helpers import cli, sh
from tests.helpers.user_job import RUN, TRAIN, wheel

SCRATCH = "/shared/scratch"
STANDARD_DDP = """\
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4) * (rank + 1)
dist.all_reduce(t)
print(f"rank {rank} of {dist.get_world_size()}: sum {t[0].item():g}", flush=True)
if rank == 0:
    torch.save({"w": t}, sys.argv[1])
dist.barrier()
dist.destroy_process_group()
"""
SBATCH = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=10
#SBATCH --output=%x-%j.out
source /opt/provision/venv/bin/activate
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint "$head:29400" \\
  --rdzv-id "$SLURM_JOB_ID" ddp.py model.pt
"""
FAILING = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=10
#SBATCH --output=%x-%j.out
srun bash -c 'if [ "$SLURM_NODEID" = 1 ]; then echo "task 1 failing on purpose"; exit 3; fi; \\
  sleep 120; echo "task 0 outlived its failed peer"'
"""
# SkyPilot's minGPT-ddp run block; CPU: --nproc_per_node=1 (was $SKYPILOT_NUM_GPUS_PER_NODE),
# and no `cd examples/mingpt` (the workdir holds the script, main.py).
SKYPILOT_RUN = """\
export LOGLEVEL=INFO

MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
echo "Starting distributed training, head node: $MASTER_ADDR"

torchrun \\
--nnodes=$SKYPILOT_NUM_NODES \\
--nproc_per_node=1 \\
--node_rank=${SKYPILOT_NODE_RANK} \\
--master_addr=$MASTER_ADDR \\
--master_port=8008 \\
main.py
"""
JOB_S = 900  # one `provision run` of the DDP task, bounded


def _as_train(command: str) -> str:
    return f"runuser -u train -- sh -c {shlex.quote(command)}"


def _sbatch(head, where: str, script: str) -> tuple[str, str]:
    """An sbatch, submitted and waited for as the training user: (job id, its output)."""
    out = sh(head, _as_train(f"cd {where} && sbatch --parsable --wait {script}; echo rc=$?"), timeout_s=600)
    job = out.splitlines()[0].strip()
    log = sh(head, f"cat {where}/{script}-{job}.out 2>/dev/null || ls {where}")
    return job, out + log


@pytest.mark.takes_s(330)
def test_the_standard_pytorch_pattern_runs_as_a_plain_user_and_a_failed_rank_ends_its_step(provisioned, testbed):
    assert provisioned.exit_code == 0
    head = inventory.load(testbed.inventory_path).head_node()[0]
    where = f"{SCRATCH}/standard-{secrets.token_hex(3)}"
    sh(head, _as_train(f"mkdir -p {where}"))
    for name, text in (("ddp.py", STANDARD_DDP), ("job.sbatch", SBATCH), ("fail.sbatch", FAILING)):
        sh(head, _as_train(f"printf '%s' {shlex.quote(text)} > {where}/{name}"))
    job, out = _sbatch(head, where, "job.sbatch")
    assert "rc=0" in out, out
    assert "rank 0 of 2: sum 3" in out
    assert "rank 1 of 2: sum 3" in out
    sh(head, f"test -s {where}/model.pt")
    # A task that fails ends its step (KillOnBadExit): its peer is killed with it rather
    # than left waiting (until the time limit, for a rank in a collective). No torch here:
    # the rule is Slurm's.
    job, out = _sbatch(head, where, "fail.sbatch")
    assert "rc=0" not in out
    assert "task 1 failing on purpose" in out
    assert "outlived its failed peer" not in out  # killed with the step, not left to sleep on
    state = sh(head, f"sacct -n -X -j {job} -o State%20").split()
    assert state[:1] == ["FAILED"], (state, out)


@pytest.fixture(scope="module")
def user_job(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("user-job")
    code = work / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "main.py").write_text(TRAIN)
    # Beside the frameworks wheelhouse the env installs from (air-gapped: --no-index), the
    # job's own wheel; tensorboard is the validated venv's and stays so.
    (code / "requirements.txt").write_text("--find-links wheels\nprovision-demo-extra==1.0\ntensorboard\n")
    wheel(code / "wheels")
    (work / "task.yaml").write_text(
        "name: ddp-e2e\nworkdir: code\nnum_nodes: 2\nenvs:\n  OMP_NUM_THREADS: 1\n"
        "setup: |\n  echo setup on $SKYPILOT_NODE_RANK\nrun: |\n  " + RUN + "\n"
    )
    (work / "skypilot.yaml").write_text(
        "name: minGPT-ddp\nworkdir: code\nnum_nodes: 2\nrun: |\n"
        + "".join(f"  {line}\n" for line in SKYPILOT_RUN.splitlines())
    )
    return work


def _check_trained(run) -> dict:
    assert run.exit_code == 0, run.stderr[-4000:]
    report = run.json()
    assert report["ok"], report
    assert sorted(report["exits"]) == ["node1", "node2"]
    assert "rank 0 of 2 on node 0 extra=42 done" in run.stderr
    assert "rank 1 of 2 on node 1 extra=42 done" in run.stderr
    assert report["metrics"]["loss"] < report["best"]["loss"] + 1e-9
    import torch

    state = torch.load(Path(report["outputs"]) / "model.pt")
    assert set(state) == {"weight", "bias"}
    return report


@pytest.mark.takes_s(600)
def test_a_users_task_through_slurm_then_over_ssh_reusing_its_env(provisioned, testbed, user_job):
    assert provisioned.exit_code == 0
    inv = str(testbed.inventory_path)
    runs = str(user_job / "runs")
    first = cli("run", inv, str(user_job / "task.yaml"), "--runs-dir", runs, "--json", timeout_s=JOB_S)
    report = _check_trained(first)
    assert "scheduler: slurm" in first.stderr
    assert report["scheduler"] == "slurm"
    assert "setup on 0" in first.stderr
    assert "Successfully installed provision-demo-extra-1.0" in first.stderr
    # The same requirements over SSH, as SkyPilot's own run block: the env is reused.
    second = cli(
        "run", inv, str(user_job / "skypilot.yaml"), "--scheduler", "ssh", "--runs-dir", runs, "--json",
        timeout_s=JOB_S,
    )  # fmt: skip
    again = _check_trained(second)
    first_node = inventory.load(testbed.inventory_path).nodes[0]
    assert f"Starting distributed training, head node: {first_node.cluster_address}" in second.stderr
    assert ": cached" in second.stderr
    assert "Successfully installed" not in second.stderr
    assert again["environment"] == report["environment"]
    listed = cli("runs", inv, "--json")
    assert listed.exit_code == 0, listed.stderr
    rows = {r["id"]: r for r in listed.json()}
    assert rows[report["run_id"]]["state"] == "succeeded"
    assert rows[again["run_id"]]["state"] == "succeeded"
    assert rows[again["run_id"]]["name"] == "minGPT-ddp"
    shown = cli("logs", inv, report["run_id"], "--node", "node2")
    assert "rank 1 of 2 on node 1 extra=42 done" in shown.stdout


@pytest.mark.takes_s(240)
def test_cancel_stops_a_detached_job_on_every_node(provisioned, testbed, tmp_path):
    assert provisioned.exit_code == 0
    inv = str(testbed.inventory_path)
    started = cli(
        "run", inv, "--scheduler", "ssh", "--nodes", "2", "--detach", "--runs-dir", str(tmp_path), "--json",
        "--", "echo started on $SKYPILOT_NODE_RANK; sleep 900",
    )  # fmt: skip
    assert started.exit_code == 0, started.stderr[-3000:]
    run_id = started.json()["run_id"]
    cluster = inventory.load(testbed.inventory_path)
    marker = f"PROVISION_RUN_ID={run_id}"
    find = f"grep -l -s -a {shlex.quote(marker)} /proc/[0-9]*/environ | wc -l"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(int(sh(n, find).strip()) for n in cluster.nodes):
        time.sleep(2)
    assert all(int(sh(n, find).strip()) for n in cluster.nodes)  # running on both nodes
    listed = {r["id"]: r for r in cli("runs", inv, "--json").json()}
    assert listed[run_id]["state"] == "running"
    cancelled = cli("cancel", inv, run_id)
    assert cancelled.exit_code == 0, cancelled.stdout + cancelled.stderr
    for node in cluster.nodes:
        assert sh(node, find).strip() == "0", node.name
    logs = cli("logs", inv, run_id)
    assert "started on 0" in logs.stdout
    assert "started on 1" in logs.stdout
