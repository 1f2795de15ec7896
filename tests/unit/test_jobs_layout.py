"""Where a job lives and the shell it runs (jobs/layout.py, jobs/slurm.py), the metrics and
records read back (jobs/results.py, jobs/records.py): pure functions, tested directly."""

from __future__ import annotations

import shlex
from pathlib import Path

from provision.jobs import layout, records, results, slurm
from provision.jobs.layout import JobPlan, NodeJob, Where
from provision.jobs.task import Task
from provision.settings import Settings


def _plan(requirements: str = "", **task: object) -> JobPlan:
    t = Task(run="python train.py", num_nodes=2, envs=(("LR", "3e-4"),), **task)  # type: ignore[arg-type]
    nodes = (
        NodeJob("node1", 0, "10.0.0.1", "eth1", 0, "/var/tmp/t/runs/job-1/node1", "train"),
        NodeJob("node2", 1, "10.0.0.2", "eth1", 0, "/var/tmp/t/runs/job-1/node2", "train"),
    )
    return JobPlan(
        "job-1",
        t,
        Where("/shared/runs/provision", True, "/shared"),
        nodes,
        29500,
        "/opt/v/bin/python",
        requirements,
        "/opt/provision/wheelhouse",
        None,
    )


def test_jobs_go_to_the_runs_share_else_scratch_else_each_nodes_work_directory():
    s = Settings(nfs_exports=["datasets", "scratch", "runs"])
    assert layout.where(s, True) == Where("/shared/runs/provision", True, "/shared")
    assert layout.where(Settings(), True) == Where("/shared/scratch/provision", True, "/shared")
    assert layout.where(Settings(), False) == Where("/var/tmp/provision-train/work/provision", False)


def test_every_node_is_told_its_rank_the_nodes_and_the_rendezvous_as_skypilot_and_torchrun_name_them():
    p = _plan()
    env = layout.job_env(p, p.nodes[1])
    assert env["SKYPILOT_NODE_RANK"] == env["NODE_RANK"] == "1"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["SKYPILOT_NUM_NODES"] == env["NNODES"] == "2"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert env["NPROC_PER_NODE"] == "1"  # no GPUs: one process
    assert env["PROVISION_RUN_DIR"] == "/shared/runs/provision/jobs/job-1"
    assert env["PROVISION_METRICS"] == "/shared/runs/provision/jobs/job-1/metrics.jsonl"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert env["LR"] == "3e-4"


def test_the_env_is_named_by_what_it_is_built_from():
    a = _plan("torch-lightning==2.5\n")
    assert a.env_dir == _plan("torch-lightning==2.5\n").env_dir
    assert a.env_dir != _plan("torch-lightning==2.6\n").env_dir
    assert _plan("").env_dir is None  # nothing to add: the validated venv itself


def test_the_env_is_built_once_under_a_lock_from_the_wheelhouse_and_a_failed_pip_leaves_nothing():
    p = _plan("tqdm==4.66.5\n")
    text = layout.env_build(p)
    assert f"until mkdir {p.env_dir}.lock" in text  # atomic on the share's server, for every node
    assert f"trap 'rmdir {p.env_dir}.lock" in text  # a failed build lets go of it
    assert f"if [ -f {p.env_dir}/{layout.ENV_DONE} ]" in text
    assert "--no-index --find-links /opt/provision/wheelhouse" in text
    assert f"rm -rf -- {p.env_dir} " in text  # after a failed pip
    assert "--system-site-packages" not in text  # the base is a venv: a .pth names its packages
    assert "provision-base.pth" in text


def test_the_launcher_records_its_group_marks_its_processes_and_starts_the_job_user_from_a_clean_environment():
    p = _plan()
    node = p.nodes[0]
    words = shlex.split(layout.launcher(p, node, "echo hi").removeprefix("cd / && exec ").removesuffix(" 2>&1"))
    assert words[:3] == ["env", "PROVISION_RUN_ID=job-1", "PROVISION_NODE=node1"]
    assert words[3:5] == ["setsid", "--wait"]
    assert f"{node.run_dir}/{layout.RUN_FILE}" in words[7]
    at = words.index("runuser")
    assert words[at : at + 4] == ["runuser", "-u", "train", "--"]
    assert words[at + 4 : at + 6] == ["env", "-i"]
    assert words[-3:] == ["-c", "echo hi", "provision-job-node1"]
    detached = layout.launcher(p, node, "echo hi", detach=True)
    assert "--wait" not in detached
    assert detached.endswith(">/dev/null 2>&1 </dev/null")


def test_a_nodes_run_saves_its_lines_and_exit_status_in_the_job_directory():
    p = _plan()
    text = layout.run_script(p, p.nodes[1])
    assert "| tee -a /shared/runs/provision/jobs/job-1/logs/node2.log" in text
    assert 'echo "$rc" > /shared/runs/provision/jobs/job-1/exit/node2' in text
    assert "set -o pipefail" in text


def test_only_the_first_node_of_a_shared_job_directory_unpacks_the_workdir_and_builds_the_env():
    p = _plan("tqdm==4.66.5\n", workdir=Path("/w"))
    first = layout.prepare_script(p, p.nodes[0], extract=True, record='{"id": "job-1"}')
    assert "> /shared/runs/provision/jobs/job-1/job.json" in first
    other = layout.prepare_script(p, p.nodes[1], extract=False, build_env=False)
    assert "workdir.tar.gz" in first
    assert "pip install" in first
    assert "workdir.tar.gz" not in other
    assert "pip install" not in other
    assert "built on the first node" in other


def test_slurm_time_rounds_up_to_whole_minutes():
    assert layout.slurm_time(None) is None
    assert layout.slurm_time(61) == "0-00:02:00"
    assert layout.slurm_time(2 * 86400) == "2-00:00:00"


def test_the_allocation_asks_for_whole_nodes_their_gpus_and_the_time_limit_and_names_the_run():
    p = _plan(gpus_per_node=8, time_limit_s=3600)
    args = slurm.allocation_args(p)
    assert "--job-name=provision-job-1" in args
    assert {"--nodes=2", "--ntasks-per-node=1", "--exclusive", "--gres=gpu:8", "--time=0-01:00:00"} <= set(args)


def test_the_batch_script_maps_slurms_nodes_to_cluster_addresses_and_runs_setup_before_run():
    p = _plan(setup="echo setting up")
    text = slurm.batch_script(p, {"node1": "10.0.0.1", "node2": "10.0.0.2"})
    assert "node1) echo 10.0.0.1 ;;" in text
    assert text.index("provision-prepare") < text.index("provision-run")
    # Without a setup nothing is left for each node to prepare: no step is spent on it.
    assert "provision-prepare" not in slurm.batch_script(_plan(), {"node1": "10.0.0.1"})
    assert "--kill-on-bad-exit=1" in text
    # The node scripts name their files by the node Slurm runs them on.
    assert '/logs/"$SLURMD_NODENAME".log' in text.replace("'\"'\"'", "'")
    assert 'SKYPILOT_NODE_RANK="$SLURM_NODEID"' in text.replace("'\"'\"'", "'")


def test_srun_labels_and_the_node_line_are_read_back():
    assert slurm.nodes_of("[provision] nodes: node1 node2") == ["node1", "node2"]
    assert slurm.split_label("  1: step 5 loss 2.3") == (1, "step 5 loss 2.3")
    assert slurm.split_label("salloc: Granted job allocation 7") is None


def test_metric_lines_keep_numbers_per_key_and_skip_what_is_not_a_metric():
    m = results.parse_metrics(
        '{"step": 1, "loss": 2.5, "lr": 0.1}\nnot json\n[1, 2]\n{"step": 2, "loss": 1.5, "note": "x", '
        '"ok": true, "nan": NaN}\n'
    )
    assert m.lines == 2
    assert m.last == {"loss": 1.5, "lr": 0.1}
    assert m.best["loss"] == 1.5
    assert m.series["loss"] == [(1, 2.5), (2, 1.5)]


def test_outputs_are_counted_and_exits_read_as_numbers():
    assert results.parse_size("3 1024\n") == (3, 1024)
    assert results.parse_size("garbage") is None
    assert results.parse_exits("node1 0\nnode2 7\nnode3 x\n") == {"node1": 0, "node2": 7}


def test_runs_are_read_from_the_records_as_data():
    text = (
        "== job-20261207-190000-abcdef\n"
        '{"id": "job-20261207-190000-abcdef", "name": "ft", "user": "train", "nodes": ["n1", "n2"], '
        '"scheduler": "ssh", "started": 1.5}\n'
        "exit n1 0\nexit n2 0\nended 1700000000\n"
        "== job-20261207-190100-abcdef\n{not json\nexit n1 3\n"
        "== ../../etc\n"
        "live job-20261207-190200-abcdef\n"
    )
    rows, live = records.parse_list(text)
    assert set(rows) == {"job-20261207-190000-abcdef", "job-20261207-190100-abcdef"}
    done = rows["job-20261207-190000-abcdef"]
    assert (done.name, done.user, done.nodes) == ("ft", "train", ["n1", "n2"])
    assert done.ended == 1700000000
    assert records.state_of(done, False, None) == "succeeded"
    assert records.state_of(rows["job-20261207-190100-abcdef"], False, None) == "failed"
    part = records.RunRow("job-20261207-190300-abcdef", nodes=["n1", "n2"], scheduler="ssh", exits={"n1": 0})
    assert records.state_of(part, False, None) == "stopped"  # n2 never said how it ended
    assert live == {"job-20261207-190200-abcdef"}
    assert records.state_of(done, True, None) == "running"
    assert records.state_of(done, False, "PENDING") == "queued"


def test_free_nodes_with_the_gpus_asked_for_are_picked_in_inventory_order_and_the_others_named():
    from provision.jobs import nodes

    def probed(gpus: int, busy: str | None = None, problem: str | None = None) -> nodes.Probed:
        node = None if problem else NodeJob("x", 0, "10.0.0.9", "eth1", gpus, "/r", None)
        return nodes.Probed(node, busy, problem)

    found = {
        "a": probed(8, busy="job-1"),
        "b": probed(8),
        "c": probed(4),
        "d": probed(8, problem="unreachable"),
        "e": probed(8),
        "f": probed(8),
    }
    chosen, passed = nodes.pick(found, list(found), 2, gpus=8)
    assert [(j.rank, j.gpus) for j in chosen] == [(0, 8), (1, 8)]
    assert passed == [
        "a: busy with job-1",
        "c: has 4 GPU(s), the task asks for 8 a node",
        "d: unreachable",
    ]


def test_file_mounts_on_a_share_are_unpacked_once_and_the_others_on_every_node():
    p = _plan(file_mounts=(("/shared/datasets/d", Path("/x")), ("/data/local", Path("/y")), ("~/cfg", Path("/z"))))
    first = layout.prepare_script(p, p.nodes[0], extract=True)
    other = layout.prepare_script(p, p.nodes[1], extract=False)
    assert "-C /shared/datasets/d" in first
    assert "-C /shared/datasets/d" not in other
    for text in (first, other):
        assert "-C /data/local" in text
        assert '-C "$HOME"/cfg' in text
    assert not Where("/x", True, "/shared").on_share("/sharedother/x")
