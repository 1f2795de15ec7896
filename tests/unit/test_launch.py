"""The launcher's pure parts: commands, parsers of captured output, verdicts, and the
node-side reaper against real local processes."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision import remote
from provision.inventory import Node, SshTarget
from provision.launch import logs, monitor, plan, reaper, report, session
from provision.launch.session import Options, Outcome
from provision.settings import Settings

FIXTURES = Path(__file__).parent.parent / "fixtures"


def two_node_plan(extra: tuple[str, ...] = ()) -> plan.RunPlan:
    nodes = tuple(
        plan.NodePlan(
            f"n{i}",
            f"10.9.0.{i + 1}",
            "eth1",
            "/opt/provision/venv/bin/python",
            2,
            f"/var/tmp/pt/runs/r1/n{i}",
            "/var/tmp/pt",
            i == 0,
        )
        for i in range(2)
    )
    args = plan.trainer_args(
        steps=5,
        model="tiny",
        world=4,
        batch_per_rank=8,
        resume=False,
        run_id="r1",
        ckpt_name="inv-tiny",
        summary="summary.json",
        extra=extra,
    )
    return plan.RunPlan("r1", "10.9.0.1", 29500, nodes, args)


# ---------------------------------------------------------------- plan


def test_every_node_meets_at_the_first_nodes_address_and_only_it_hosts_the_store():
    p = two_node_plan()
    argvs = [plan.torchrun_argv(p, n) for n in p.nodes]
    for n, argv in zip(p.nodes, argvs, strict=True):
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.9.0.1:29500"
        assert argv[argv.index("--rdzv-id") + 1] == "r1"
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--local-addr") + 1] == n.address
        assert argv[argv.index("--max-restarts") + 1] == "0"
    assert [a[a.index("--rdzv-conf") + 1] for a in argvs] == ["is_host=1", "is_host=0"]


def test_node_command_records_the_pgid_before_torchrun_starts_under_setsid():
    p = two_node_plan()
    cmd = plan.node_command(p, p.nodes[1])
    words = shlex.split(cmd)
    start = words.index("setsid")
    assert words[start : start + 3] == ["setsid", "--wait", "sh"]
    record = words[start + 4]
    assert record.startswith("echo $$ > /var/tmp/pt/runs/r1/n1/torchrun.pid && exec")
    env = words[words.index("env") + 1 : words.index("/opt/provision/venv/bin/python")]
    assert "NCCL_SOCKET_IFNAME=eth1" in env
    assert "GLOO_SOCKET_IFNAME=eth1" in env
    assert "PROVISION_RUN_ID=r1" in env
    assert "PROVISION_NODE=n1" in env
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[rank${rank}]:" in env
    # The markers come before setsid: the recorded pid carries them (the reaper checks).
    assert cmd.startswith("cd /var/tmp/pt && exec env PROVISION_RUN_ID=r1 PROVISION_NODE=n1 setsid --wait ")


def test_as_root_the_trainer_runs_as_the_training_user_in_the_same_process_group():
    # root_squash maps root to nobody on the NFS shares: the training user owns them.
    base = two_node_plan()
    node = dataclasses.replace(base.nodes[1], run_as="train")
    cmd = plan.node_command(base, node)
    words = shlex.split(cmd)
    # setsid's shell records the group id, then becomes runuser, which runs env + torchrun
    # as the user without a session or group of its own.
    after = words[words.index("provision-train") + 1 :]
    assert after[:5] == ["runuser", "-u", "train", "--", "env"]
    # Nothing is handed to the training user here: the run directory (reaper, pid file)
    # stays root's (node_dirs_command made the directories before).
    assert "chown" not in cmd
    assert cmd.startswith("cd /var/tmp/pt && exec env ")
    assert "runuser" not in plan.node_command(base, base.nodes[1])  # a non-root SSH user runs it itself


def test_node_directories_never_change_an_owner_recursively_and_give_the_user_two_fresh_ones():
    cmd = plan.node_dirs_command("/var/tmp/pt", "/var/tmp/pt/runs/r1/n1", "train")
    chowns = [c.split("&&")[0].split(";")[0].strip() for c in cmd.split("chown")[1:]]
    assert chowns == ["-h -- train: /var/tmp/pt/runs/r1/n1/torchrun-logs", "-h -- train: /var/tmp/pt/work"]
    # The run directory is made fresh (no -p: mkdir fails when it exists) with mode 0755.
    assert "mkdir -m 0755 -- /var/tmp/pt/runs/r1/n1 /var/tmp/pt/runs/r1/n1/torchrun-logs" in cmd
    assert cmd.startswith("umask 022; T=/var/tmp/pt; ")


def test_a_train_dir_the_node_refuses_stops_the_run_before_anything_starts(monkeypatch, tmp_path):
    both = ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"]
    with pytest.raises(session.LaunchError) as e:
        prepare_with_fake_nodes(
            monkeypatch, tmp_path, {"n0": both, "n1": both}, dirs="/var/tmp/provision-train is owned by uid 1001"
        )
    assert "train_dir /var/tmp/provision-train cannot be used: /var/tmp/provision-train is owned by uid 1001" in str(
        e.value
    )
    assert "remove it if another user made it, or set train_dir" in str(e.value)


def test_the_trainer_works_in_the_work_directory_beside_the_runs(monkeypatch, tmp_path):
    both = ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"]
    run_plan, _, _ = prepare_with_fake_nodes(monkeypatch, tmp_path, {"n0": both, "n1": both})
    assert {n.work_dir for n in run_plan.nodes} == {"/var/tmp/provision-train/work"}
    assert {n.run_dir for n in run_plan.nodes} == {f"/var/tmp/provision-train/runs/r1/{n}" for n in ("n0", "n1")}


def test_reaper_refuses_pid_files_that_do_not_name_one_process_above_1():
    for text in ("1", "0", "-1", "-4242", "", "abc", "12abc", "1 2", "²", "99999999999"):
        assert reaper.parse_pid(text) is None, text
    assert reaper.parse_pid("4242\n") == 4242


def test_global_batch_grows_with_the_world_and_user_flags_come_last():
    p = two_node_plan(extra=("--lr", "3e-4"))
    args = list(p.trainer_args)
    assert args[args.index("--global-batch") + 1] == "32"  # 8 per rank x 4 ranks
    assert args[args.index("--micro-batch") + 1] == "8"
    assert args[-2:] == ["--lr", "3e-4"]
    assert "--resume" not in args


def options(tmp_path: Path, extra: tuple[str, ...] = ()) -> Options:
    return Options(
        steps=5,
        model="tiny",
        nproc_per_node=None,
        batch_per_rank=8,
        resume=False,
        extra_args=extra,
        python=None,
        runs_dir=tmp_path,
        monitor_interval=5.0,
        timeout_s=None,
        ckpt_name="inv-tiny",
    )


def nfs_node(i: int) -> Node:
    settings = Settings(cluster_address=f"10.9.0.{i + 1}", nfs_mount_root="/mnt/nfs")
    return Node(
        f"n{i}", SshTarget(f"192.0.2.{i + 1}", 22, None, None, None, "yes"), ("storage",) if i == 0 else (), settings
    )


class FakeConn:
    def put(self, local: str, remote_path: str) -> None:
        pass


def prepare_with_fake_nodes(
    monkeypatch,
    tmp_path,
    writable: dict[str, list[str]],
    extra: tuple[str, ...] = (),
    run_as: str = "",
    dirs: str = "DIRS_OK",
) -> tuple[plan.RunPlan, list[str], list[str]]:
    """session.prepare against two nodes whose probe answers as given (no SSH)."""
    probes: list[str] = []
    said: list[str] = []

    def fake_run(node, command, timeout=None, conn=None):
        probes.append(command)
        ip = json.dumps([{"ifname": "eth1", "addr_info": [{"local": node.cluster_address}]}])
        out = f"PY_OK\n{ip}\n--gpus--\n--run-as--\n{run_as}\n--writable--\n" + "".join(
            f"{w}\n" for w in writable[node.name]
        )
        out += f"--dirs--\n{dirs}\n"
        return remote.CommandResult(node.name, 0, out, "")

    monkeypatch.setattr(remote, "run", fake_run)
    nodes = [nfs_node(0), nfs_node(1)]
    run_plan = session.prepare(
        nodes,
        {n.name: FakeConn() for n in nodes},
        options(tmp_path, extra),
        "r1",
        lambda host, text: said.append(f"{host}: {text}"),
        nfs_server=True,
    )
    return run_plan, probes, said


def test_checkpoints_and_token_cache_go_to_the_nfs_shares_named_by_the_settings(monkeypatch, tmp_path):
    both = ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"]
    run_plan, probes, said = prepare_with_fake_nodes(monkeypatch, tmp_path, {"n0": both, "n1": both})
    assert all('test -w "$1"; fi\' - /mnt/nfs/checkpoints && echo /mnt/nfs/checkpoints;' in c for c in probes)
    assert all(n.run_as is None for n in run_plan.nodes)
    words = shlex.split(plan.node_command(run_plan, run_plan.nodes[1]))
    trainer = words[words.index("/var/tmp/provision-train/runs/r1/n1/train_ddp.py") + 1 :]
    assert trainer[trainer.index("--ckpt-dir") + 1] == "/mnt/nfs/checkpoints"
    assert trainer[trainer.index("--data-cache") + 1] == "/mnt/nfs/datasets/train_ddp"
    assert not any("note" in line for line in said)


def test_a_share_that_a_node_cannot_write_is_left_out_with_a_note(monkeypatch, tmp_path):
    run_plan, _, said = prepare_with_fake_nodes(
        monkeypatch, tmp_path, {"n0": ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"], "n1": ["/mnt/nfs/checkpoints"]}
    )
    args = list(run_plan.trainer_args)
    assert args[args.index("--ckpt-dir") + 1] == "/mnt/nfs/checkpoints"
    assert "--data-cache" not in args
    assert any("/mnt/nfs/datasets is not writable on n1" in line for line in said)


def test_the_users_own_trainer_dirs_win_and_no_nfs_server_means_no_shares(monkeypatch, tmp_path):
    both = ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"]
    run_plan, _, _ = prepare_with_fake_nodes(
        monkeypatch,
        tmp_path,
        {"n0": both, "n1": both},
        extra=("--ckpt-dir", "/scratch/ck", "--data-cache=/scratch/data"),
    )
    args = list(run_plan.trainer_args)
    assert args.count("--ckpt-dir") == 1
    assert args[args.index("--ckpt-dir") + 1] == "/scratch/ck"
    assert "/mnt/nfs/datasets/train_ddp" not in args
    settings = Settings(nfs_mount_root="/mnt/nfs", nfs_exports=["scratch"])
    assert plan.shares(settings, True, ()) == ()
    assert plan.shares(Settings(), False, ()) == ()
    assert [s.path for s in plan.shares(Settings(), True, ())] == ["/shared/checkpoints", "/shared/datasets/train_ddp"]


def test_a_log_that_cannot_be_written_ends_the_nodes_stream_with_a_reason(tmp_path):
    """The stream thread must tell the watcher, or every other node waits in the
    rendezvous until it times out."""
    (tmp_path / "a-file").write_text("")
    p = two_node_plan()
    sup = session.Supervisor([], {}, p, options(tmp_path / "a-file" / "runs"), lambda *a: None)
    sup._stream(p.nodes[0])
    host, end = sup._ended.get_nowait()
    assert host == "n0"
    assert end.exited == -1
    assert "log stream failed" in end.reason


def test_interface_is_found_by_the_address_it_holds():
    ip_json = (FIXTURES / "ip-d-j-addr_ubuntu-laptop_netplan-test.json").read_text()
    links = json.loads(ip_json)
    named = {i["local"]: link["ifname"] for link in links for i in link.get("addr_info", [])}
    address, ifname = next((a, n) for a, n in named.items() if n not in ("lo",))
    assert plan.interface_for(address, ip_json) == ifname
    assert plan.interface_for("203.0.113.77", ip_json) is None


def test_gpu_count_reads_nvidia_smi_list_and_zero_without_it():
    listing = (
        "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"
        "GPU 1: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000001)\n"
    )
    assert plan.gpu_count(listing) == 2
    assert plan.gpu_count("") == 0


def test_gpus_with_mig_devices_are_named_and_whole_gpus_are_not():
    # nvidia-smi -L's layout with MIG on (NVIDIA's MIG user guide): devices indented under their GPU
    listing = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc40)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-4ce3fbc2-fe20-5e2a-8c73-8d7c2a1f5b2a)\n"
        "  MIG 1g.5gb      Device  1: (UUID: MIG-a91c2a1e-6a2f-5b0e-9a47-1d5c3b7e8f10)\n"
    )
    assert plan.gpu_count(listing) == 2  # MIG devices are not GPUs of their own
    assert plan.mig_gpus(listing) == [1]
    assert plan.mig_gpus(listing.split("  MIG")[0]) == []


def test_nproc_accepts_auto_or_a_positive_integer():
    assert plan.parse_nproc("auto") is None
    assert plan.parse_nproc("4") == 4
    for bad in ("0", "-1", "many"):
        with pytest.raises(ValueError, match=bad):
            plan.parse_nproc(bad)


def test_model_sizes_are_read_from_the_trainer_source():
    sizes = plan.model_sizes()
    assert sizes["tiny"] == (2, 2, 64, 64)
    assert "gpt2" in sizes


# ---------------------------------------------------------------- logs


def test_rank0_lines_give_loss_curves_throughput_and_the_summary():
    curves = logs.Curves()
    for line in (FIXTURES / "train-ddp-log_rank0_2-node-cpu.log").read_text().splitlines():
        who, text = logs.split_rank(line)
        if who == "rank0":
            curves.feed(text)
    assert [s for s, _ in curves.train] == list(range(1, 31))
    assert [s for s, _ in curves.val] == [10, 20, 30]
    assert all(tps > 0 for _, tps in curves.tokens_per_s)
    assert curves.summary["world_size"] == 2
    assert set(curves.summary["nodes"]) == {"ns0", "ns1"}
    assert curves.train[-1][1] == pytest.approx(curves.summary["final_train_loss"], abs=1e-4)


def test_a_restart_from_a_checkpoint_replaces_the_curves_points_it_trains_again():
    """A requeued Slurm job's next attempt resumes at its checkpoint (step 4 here) after the
    first reached step 6: steps 5 and 6 are trained again, and the curves keep the new ones."""
    curves = logs.Curves()
    lines = [f"step {n}/8 | train loss {9 - n}.0 | lr 1e-3 | {100 * n} tok/s | 5.0 ms" for n in range(1, 7)]
    lines.insert(4, "step 4/8 | val loss 5.5")
    lines += [f"step {n}/8 | train loss {n}.5 | lr 1e-3 | {1000 * n} tok/s | 5.0 ms" for n in range(5, 9)]
    lines += ["step 8/8 | val loss 4.4"]
    for line in lines:
        curves.feed(line)
    assert [s for s, _ in curves.train] == list(range(1, 9))
    assert curves.train[4] == (5, 5.5)
    assert [s for s, _ in curves.tokens_per_s] == list(range(1, 9))
    assert curves.tokens_per_s[-1] == (8, 8000.0)
    assert curves.val == [(4, 5.5), (8, 4.4)]


def test_the_report_says_how_many_times_a_requeueable_job_was_requeued(tmp_path):
    p = two_node_plan()
    r = report.build(Outcome("r1", p, tmp_path, requeues=1), tmp_path / "rec.json", "sig")
    assert r.requeues == 1
    assert report.to_json(r)["requeues"] == 1
    assert report.build(Outcome("r1", p, tmp_path), tmp_path / "rec.json", "sig").requeues is None


def test_torchrun_lines_without_a_rank_prefix_are_torchruns_own():
    assert logs.split_rank("[rank12]:step 1/2 | x") == ("rank12", "step 1/2 | x")
    assert logs.split_rank("Root Cause (first observed failure):") == (
        "torchrun",
        "Root Cause (first observed failure):",
    )


def test_the_rank_killed_by_a_signal_is_named_first_not_the_peer_that_lost_it():
    killed = logs.rank_failures((FIXTURES / "torchrun-failure_sigkill_2-agent-loopback_torch-2.13.log").read_text())
    peer = logs.rank_failures((FIXTURES / "torchrun-failure_peer-exit1_2-agent-loopback_torch-2.13.log").read_text())
    assert killed == [logs.RankFailure(1, -9, "2026-11-29_23:11:42")]
    assert peer == [logs.RankFailure(0, 1, "2026-11-29_23:11:44")]
    host, failure = logs.first_failure({"a": peer, "b": killed})
    assert (host, failure.rank) == ("b", 1)
    assert logs.first_failure({"a": [], "b": []}) is None


def test_a_torchrun_stopped_by_the_launcher_reports_no_rank_failure():
    text = (FIXTURES / "torchrun-failure_peer-lost_gloo-cpu_torch-2.13.log").read_text()
    assert logs.rank_failures(text) == []
    killed = (FIXTURES / "torchrun-failure_sigkilled-rank_gloo-cpu_torch-2.13.log").read_text()
    assert [(f.rank, f.exitcode) for f in logs.rank_failures(killed)] == [(1, -9)]


def test_line_sink_reassembles_lines_split_across_chunks(tmp_path):
    seen = []
    with open(tmp_path / "h.log", "w") as log:
        sink = logs.LineSink("h", log, lambda h, who, text: seen.append((h, who, text)))
        for chunk in ("[rank0]:step 1/2 | tra", "in loss 5.0\n[rank1]:x\r\nno newline"):
            sink.write(chunk)
        sink.close()
    assert seen == [("h", "rank0", "step 1/2 | train loss 5.0"), ("h", "rank1", "x"), ("h", "torchrun", "no newline")]
    assert (tmp_path / "h.log").read_text().splitlines()[0] == "[rank0]:step 1/2 | train loss 5.0"


# ---------------------------------------------------------------- monitor


def test_cpu_and_ram_use_come_from_two_proc_readings():
    a = monitor.parse_sample((FIXTURES / "monitor-sample_dev-vm-no-gpu.txt").read_text(), 0.0)
    b = monitor.parse_sample((FIXTURES / "monitor-sample_dev-vm-no-gpu_2s-later.txt").read_text(), 2.0)
    # cpu  358615 0 18827 150642 1151 0 1983 2988 -> cpu  358965 0 18878 150642 1151 0 1983 2988
    busy = (358965 - 358615) + (18878 - 18827)
    s = monitor.difference(a, b)
    assert s.cpu_pct == pytest.approx(100.0 * busy / busy)  # idle did not move: 100 % busy
    assert s.mem_pct == pytest.approx(100 * (1 - 14314524 / 24683656))
    assert s.gpu_util is None
    assert b.gpus == ()


def test_gpu_utilisation_and_memory_are_parsed_from_nvidia_smi_csv():
    """The H200 capture's own values for the four fields the monitor asks for, written the
    way `--format=csv,noheader,nounits` prints them."""
    with open(FIXTURES / "nvidia-smi-query-gpu-csv_h200_590.48.01.csv") as f:
        header, row = [[c.strip() for c in r] for r in csv.reader(f)][:2]
    col = {name: row[i] for i, name in enumerate(header)}
    fields = [col["index"], col["utilization.gpu [%]"], col["memory.used [MiB]"], col["memory.total [MiB]"]]
    line = ", ".join(v.split()[0] for v in fields)
    proc = (FIXTURES / "monitor-sample_dev-vm-no-gpu.txt").read_text()
    raw = monitor.parse_sample(proc + line + "\n[N/A], bad line\n", 0.0)
    assert raw.gpus == ((0.0, 0.0, 143771.0),)


def test_usage_gives_mean_and_peak():
    samples = [monitor.Sample(t, cpu, mem, gpu, 10.0) for t, cpu, mem, gpu in [(1, 50, 20, 90), (2, 100, 30, 70)]]
    u = monitor.usage(samples)
    assert (u.cpu_mean, u.cpu_peak, u.mem_peak, u.gpu_util_mean, u.gpu_util_peak) == (75, 100, 30, 80, 90)
    assert monitor.usage([]) is None


# ---------------------------------------------------------------- report


def test_a_node_with_a_slow_own_step_time_is_named_a_straggler():
    assert report.stragglers({"a": 10.0, "b": 10.5, "c": 14.0}) == ["c"]
    assert report.stragglers({"a": 10.0, "b": 11.0, "c": 11.5}) == []
    assert report.stragglers({"a": 10.0}) == []


def test_the_reports_straggler_is_the_node_with_the_slow_own_step_not_the_slow_forward(tmp_path):
    """As measured on netns hosts with one throttled: the fast node's forward passes
    absorbed its wait for the slow one (3.7x the slow one's), while its own step (its step
    less its wait at the all-reduce) was short."""
    out = Outcome("r1", two_node_plan(), tmp_path)
    out.curves.summary = {
        "ranks": [
            {"rank": 0, "node": "n0", "tokens_per_s": 900.0, "forward_ms": 37.0, "step_ms": 60.0, "wait_ms": 40.0},
            {"rank": 1, "node": "n1", "tokens_per_s": 400.0, "forward_ms": 10.0, "step_ms": 60.0, "wait_ms": 2.0},
        ]
    }
    r = report.build(out, tmp_path / "rec.json", "sig")
    assert [(n.name, n.own_step_ms) for n in r.nodes] == [("n0", 20.0), ("n1", 58.0)]
    assert r.stragglers == ["n1"]
    assert report.stragglers({n.name: n.forward_ms for n in r.nodes}) == ["n0"]  # what forward time would say
    # A summary from before step and wait times were reported: no signal, nobody named.
    for rank in out.curves.summary["ranks"]:
        del rank["wait_ms"]
    r = report.build(out, tmp_path / "rec.json", "sig")
    assert [n.own_step_ms for n in r.nodes] == [None, None]
    assert r.stragglers == []


def test_scaling_efficiency_compares_with_the_latest_matching_single_node_record(tmp_path):
    path = tmp_path / "records.json"
    report.save_record(path, report.Record("old", "sig", 1, 100.0, 1.0))
    report.save_record(path, report.Record("new", "sig", 1, 120.0, 2.0))
    report.save_record(path, report.Record("other", "other-sig", 1, 50.0, 3.0))
    report.save_record(path, report.Record("two", "sig", 2, 200.0, 4.0))
    ref = report.reference(report.load_records(path), "sig")
    assert ref.run_id == "new"
    assert report.scaling_efficiency(216.0, 2, ref.tokens_per_s) == pytest.approx(0.9)
    assert report.reference(report.load_records(path), "unseen") is None


def test_a_run_that_failed_is_not_ok_and_names_who_failed(tmp_path):
    p = two_node_plan()
    out = Outcome(
        "r1",
        p,
        tmp_path,
        failure="n1 rank 3 failed first (killed by signal 9)",
        failed_host="n1",
        failed_rank=3,
        teardown={"n0": {"left": []}, "n1": {"left": []}},
    )
    r = report.build(out, tmp_path / "rec.json", "sig")
    assert not r.ok
    assert r.failed_host == "n1"
    assert r.failed_rank == 3
    assert [n.clean for n in r.nodes] == [True, True]
    assert not (tmp_path / "rec.json").exists()  # failed runs are not references


# ---------------------------------------------------------------- reaper (real processes)


def spawn_fake_run(tmp_path: Path, run_id: str, node: str) -> tuple[subprocess.Popen, Path]:
    """A stand-in for torchrun's process tree: a session leader (pid recorded in the run
    file) with a child in a session of its own (as torchrun starts workers)."""
    run_dir = tmp_path / node
    run_dir.mkdir()
    child = f"{sys.executable} -c 'import os,time; os.setsid(); time.sleep(300)'"
    script = f"echo $$ > {run_dir}/torchrun.pid; {child} & sleep 300"
    env = {**os.environ, "PROVISION_RUN_ID": run_id, "PROVISION_NODE": node}
    proc = subprocess.Popen(["setsid", "sh", "-c", script], env=env)
    deadline = time.monotonic() + 30  # the child is a Python start: seconds on a loaded machine
    while time.monotonic() < deadline:
        if (run_dir / "torchrun.pid").exists() and len(
            reaper.targets(int((run_dir / "torchrun.pid").read_text()), run_id, node)
        ) >= 3:
            break
        time.sleep(0.05)
    return proc, run_dir


def test_blame_names_the_killed_rank_but_not_after_ctrl_c_and_not_an_errored_peer_after_a_lost_link():
    killed = (FIXTURES / "torchrun-failure_sigkill_2-agent-loopback_torch-2.13.log").read_text()
    peer = (FIXTURES / "torchrun-failure_peer-exit1_2-agent-loopback_torch-2.13.log").read_text()
    texts = {"a": peer, "b": killed}
    failure, host, rank = logs.blame("a: torchrun exited 1", "a", texts)
    assert (host, rank) == ("b", 1)
    assert failure == "b rank 1 failed first (killed by signal 9); a: torchrun exited 1"
    assert logs.blame("interrupted (Ctrl-C)", None, texts) == ("interrupted (Ctrl-C)", None, None)
    assert logs.blame("a: SSH connection lost", "a", {"a": peer}) == ("a: SSH connection lost", "a", None)
    sigterm = killed.replace("exitcode  : -9", "exitcode  : -15")
    assert logs.blame("a: torchrun exited 1", "a", {"b": sigterm})[1:] == ("a", None)


def test_a_root_probe_that_finds_the_training_user_runs_the_trainer_as_it(monkeypatch, tmp_path):
    both = ["/mnt/nfs/checkpoints", "/mnt/nfs/datasets"]
    run_plan, probes, _ = prepare_with_fake_nodes(
        monkeypatch, tmp_path, {"n0": both, "n1": both}, run_as="RUN_AS=train"
    )
    assert [n.run_as for n in run_plan.nodes] == ["train", "train"]
    # Writability of the shares is asked as that user (root_squash), not as root.
    assert all("runuser -u train -- test -w" in c for c in probes)


def test_a_node_whose_gpus_run_mig_is_refused_before_anything_is_uploaded(tmp_path, monkeypatch):
    # The node's probe answers as a MIG-enabled A100 node would (nvidia-smi -L with MIG
    # devices under GPU 1); the run stops there, naming the GPU, and uploads nothing.
    listing = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f)\n"
        "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc40)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-4ce3fbc2-fe20-5e2a-8c73-8d7c2a1f5b2a)\n"
    )
    probe = f"PY_OK\n[]\n--gpus--\n{listing}--run-as--\n\n--writable--\n--dirs--\nDIRS_OK\n"
    monkeypatch.setattr(session.remote, "run", lambda *a, **k: remote.CommandResult("n0", 0, probe, ""))

    class NoUploads:
        def put(self, *args, **kwargs):
            raise AssertionError(f"uploaded {args} to a node that cannot run the trainer")

    node = Node("n0", SshTarget("192.0.2.1", 22, None, None, None, "yes"), (), Settings(cluster_interface="eth1"))
    with pytest.raises(session.LaunchError, match=r"MIG is enabled on GPU 1: .* disable MIG \(`nvidia-smi -mig 0`"):
        session._prepare_node(node, NoUploads(), options(tmp_path), "run1", True, lambda *_: None)


def test_a_node_check_that_runs_out_of_time_says_so_not_that_torch_is_missing(tmp_path, monkeypatch):
    # A just-booted emulated node took over a minute to import torch: the check was cut off,
    # and the message blamed the venv. It now names the timeout, and the bound is the
    # node's command deadline up to PROBE_TIMEOUT_S.
    asked = {}

    def timed_out(node, command, timeout=None, conn=None):
        asked["timeout"] = timeout
        return remote.CommandResult(node.name, remote.TIMED_OUT, "", "timed out after 300 s (no exit status)")

    monkeypatch.setattr(session.remote, "run", timed_out)
    node = Node("n0", SshTarget("192.0.2.1", 22, None, None, None, "yes"), (), Settings())
    with pytest.raises(session.LaunchError, match=r"checking python, interface and GPUs timed out after 300 s"):
        session._prepare_node(node, None, options(tmp_path), "run1", True, lambda *_: None)
    assert asked["timeout"] == session.PROBE_TIMEOUT_S
    short = Node("n0", node.ssh, (), Settings(command_timeout_s=20))
    with pytest.raises(session.LaunchError, match=r"timed out after 20 s"):
        session._prepare_node(short, None, options(tmp_path), "run1", True, lambda *_: None)
