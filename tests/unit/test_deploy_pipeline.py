"""Step selection, bad input for up/plan, and the verify suite's ssh_config."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.errors import InputError
from provision.remote import ssh_config
from provision.up import pipeline
from tests.helpers.deploy_facts import node


def names(steps: list) -> list[str]:
    return [s.name for s in steps]


def test_all_steps_in_order_by_default() -> None:
    assert names(pipeline.select())[:4] == ["preflight", "base", "nvidia", "frameworks"]


def test_only_keeps_preflight_and_skip_removes_it_by_name() -> None:
    assert names(pipeline.select(only="nvidia")) == ["preflight", "nvidia"]
    assert names(pipeline.select(only="base", skip="preflight")) == ["base"]
    assert "nvidia" not in names(pipeline.select(skip="nvidia"))


def test_unknown_step_is_bad_input_naming_the_known_ones() -> None:
    with pytest.raises(InputError) as e:
        pipeline.select(only="bsae")
    assert str(e.value.problems[0]).startswith("--only bsae: unknown step (steps are: preflight, base, nvidia")


def test_cli_unknown_step_exits_2_with_one_line(cli, tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text("nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1})]\n")
    result = cli("up", str(inventory), "--skip", "nvidai")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "error: --skip nvidai: unknown step (steps are: " + ", ".join(pipeline.step_names()) + ")"
    ]


def test_empty_wheelhouse_is_bad_input_before_any_host(cli, tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'wheelhouse': '{tmp_path}'}})]\n"
    )
    result = cli("up", str(inventory), "--only", "frameworks")
    assert result.code == 2
    assert "holds no .whl files" in result.err


def test_ssh_config_pins_host_keys_and_key_file() -> None:
    text = ssh_config([node("node1")])
    assert "Host node1\n  HostName 10.0.0.1\n  Port 22\n" in text
    assert "StrictHostKeyChecking yes" in text
    assert "User root" in text


def test_missing_backup_password_file_is_bad_input_before_any_host(cli, tmp_path, monkeypatch) -> None:
    contacted = []
    monkeypatch.setattr(
        pipeline.engine, "run_steps", lambda *args, **kwargs: contacted.append("run_steps_stand_in")
    )  # test stand-in
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, "
        f"'backup_password_file': '{tmp_path}/nope'}})]\nstorage = ['n1']\n"
    )
    result = cli("up", str(inventory), "--only", "backups")
    assert result.code == 2
    assert [line for line in result.err.splitlines() if line.startswith("error:")] == [
        f"error: {inventory}: host n1: key backup_password_file: {tmp_path}/nope does not exist "
        "(create it, or unset the key to generate one)"
    ]
    assert contacted == []


def test_backup_inputs_are_checked_on_hosts_that_back_up_when_the_step_runs(tmp_path) -> None:
    from provision import inventory as inventory_lib

    empty = tmp_path / "empty"
    empty.write_text("\n")
    inventory = tmp_path / "inv.py"
    inventory.write_text(  # n1 backs up with no repository; n2 has no backup, so its file is unused
        f"nodes = [('n1', {{'ssh_hostname': '192.0.2.1', 'backup_paths': ['/home'], "
        f"'backup_password_file': '{empty}'}}), ('n2', {{'ssh_hostname': '192.0.2.2', "
        f"'backup_password_file': '{tmp_path}/nope'}})]\n"
    )
    cluster = inventory_lib.load(inventory)
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(cluster, pipeline.select(only="backups"))
    assert [str(p) for p in e.value.problems] == [
        f"{inventory}: host n1: key backup_password_file: {empty} is empty (restic refuses an empty password)",
        f"{inventory}: host n1: key backup_repository: no repository: not set, "
        "and no storage host to hold the default one (put a host in the 'storage' group, or set backup_repository)",
    ]
    pipeline.check_inputs(cluster, pipeline.select(skip="backups,frameworks"))  # not this run's concern


def _hosts(tmp_path, count: int, data: str = "") -> object:
    from provision import inventory as inventory_lib

    inventory = tmp_path / "inv.py"
    hosts = ", ".join(f"('n{i}', {{'ssh_hostname': '192.0.2.{i}'{data}}})" for i in range(1, count + 1))
    inventory.write_text(f"nodes = [{hosts}]\n")
    return inventory_lib.load(inventory)


def test_an_index_install_without_a_lock_is_refused_in_one_line_however_many_hosts(tmp_path) -> None:
    cluster = _hosts(tmp_path, 5)
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(cluster, pipeline.select(only="frameworks"))
    assert [str(p) for p in e.value.problems] == [
        f"{cluster.path}: hosts n1, n2, n3 and 2 more: key pip_lock_file: pip would install from an index "
        "without checking any file's hash (set pip_lock_file (uv pip compile --universal --generate-hashes "
        "-o pip-lock.txt, from the pins), or a wheelhouse; pip_require_hashes = false takes the index's files "
        "unchecked)"
    ]
    pipeline.check_inputs(_hosts(tmp_path, 2, ", 'pip_require_hashes': False"), pipeline.select(only="frameworks"))


def test_a_lock_that_is_missing_or_not_a_lock_is_named_before_any_host(tmp_path) -> None:
    lock = tmp_path / "pip-lock.txt"
    cluster = _hosts(tmp_path, 1, f", 'pip_lock_file': '{lock}'")
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(cluster, pipeline.select(only="frameworks"))
    assert [str(p) for p in e.value.problems] == [
        f"{cluster.path}: host n1: key pip_lock_file: {lock} does not exist (write the lock, or unset pip_lock_file)"
    ]
    for odd in (tmp_path, Path("/dev/zero")):  # a directory; a device that never ends
        at = _hosts(tmp_path, 1, f", 'pip_lock_file': '{odd}'")
        with pytest.raises(InputError) as e:
            pipeline.check_inputs(at, pipeline.select(only="frameworks"))
        assert [p.what for p in e.value.problems] == [f"{odd} is not a regular file"]
    big = tmp_path / "big.txt"
    big.write_bytes(b"#" * (pipeline.LOCK_MAX_BYTES + 1))
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(_hosts(tmp_path, 1, f", 'pip_lock_file': '{big}'"), pipeline.select(only="frameworks"))
    assert [p.what for p in e.value.problems] == [f"{big} is over 8 MiB"]
    cluster = _hosts(tmp_path, 1, f", 'pip_lock_file': '{lock}'")
    lock.write_text("torch==2.13.0\n--extra-index-url http://10.0.0.9/simple\n")
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(cluster, pipeline.select(only="frameworks"))
    whys = [p.what for p in e.value.problems]
    assert whys[:2] == [
        f"{lock}: line 1: 'torch==2.13.0' is not `name==version --hash=sha256:<64 hex>`",
        f"{lock}: line 2: '--extra-index-url http://10.0.0.9/simple' is not `name==version --hash=sha256:<64 hex>`",
    ]
    good = "".join(
        f"{p} --hash=sha256:{'c' * 64}\n"
        for p in ("torch==2.13.0", "numpy==2.2.6", "nvidia-ml-py==13.580.126", "tensorboard==2.21.0")
    )
    lock.write_text(good)
    pipeline.check_inputs(cluster, pipeline.select(only="frameworks"))


def test_hosts_sharing_a_wheelhouse_have_it_hashed_once(tmp_path, monkeypatch) -> None:
    from provision.rules import frameworks as framework_rules

    house = tmp_path / "wheels"
    house.mkdir()
    for name in ("torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl", "numpy-2.2.6-cp311-cp311-linux_x86_64.whl"):
        (house / name).write_bytes(b"wheel")
    (house / "nvidia_ml_py-13.580.126-py3-none-any.whl").write_bytes(b"wheel")
    (house / "tensorboard-2.21.0-py3-none-any.whl").write_bytes(b"wheel")
    framework_rules.write_sums(house)
    hashed = []
    real = framework_rules.sums_problem
    monkeypatch.setattr(framework_rules, "sums_problem", lambda d: hashed.append(d) or real(d))
    pipeline.check_inputs(_hosts(tmp_path, 4, f", 'wheelhouse': '{house}'"), pipeline.select(only="frameworks"))
    assert hashed == [str(house)]


def test_after_the_slurm_step_the_head_alone_runs_its_second_pass(tmp_path, monkeypatch) -> None:
    """deploys/slurm/controller.py: slurmctld's restart or reconfigure once every host of the
    wave has written its Slurm files; on the head alone, where its slurm step ran to the end."""
    from provision.deploys.slurm import controller
    from provision.engine import HostResult, RunReport

    ran: list[tuple[object, list[str]]] = []
    outcome: dict[str, object] = {}

    def run_steps_stand_in(cluster, steps, on_event, after_step):  # test stand-in: every host ends each step
        results = {n.name: HostResult(n.name) for n in cluster.nodes}
        for step in steps:
            for r in results.values():
                r.steps.append(step.name)
            for name, change in outcome.items():
                if step.name == "slurm" and name in results:
                    change(results[name])  # type: ignore[operator]
            after_step(step, results)
        return RunReport(results)

    monkeypatch.setattr(pipeline.engine, "run_steps", run_steps_stand_in)
    monkeypatch.setattr(
        pipeline.engine,
        "run_step",
        lambda step, nodes, results, on_event, run: ran.append((step, [n.name for n in nodes])),
    )  # test stand-in
    cluster = _hosts(tmp_path, 3)  # no head group, no storage host: n1 is the head

    def wave(nodes=None) -> list[tuple[object, list[str]]]:
        ran.clear()
        part = cluster if nodes is None else cluster.part([cluster.node(n) for n in nodes])
        pipeline._up_wave(part, pipeline.select(only="slurm"), lambda h, t: None, None, None)
        return ran[:]

    assert wave() == [(controller.CONTROLLER_STEP, ["n1"])]
    assert wave(["n2", "n3"]) == []  # the head is not in this wave: its files did not change
    outcome["n1"] = lambda r: r.fail("slurm", "apt-get failed")
    assert wave() == []
    outcome["n1"] = lambda r: r.steps.remove("slurm")  # skipped on the head (Ubuntu 22.04, say)
    assert wave() == []
    outcome.clear()
    ran.clear()
    pipeline._up_wave(cluster, pipeline.select(only="base"), lambda h, t: None, None, None)
    assert ran == []  # only after the slurm step
