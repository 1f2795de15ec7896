"""`provision facts` against a real sshd on loopback: the runner's first real pyinfra run."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.helpers import loopback_sshd


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def write_inventory(path: Path, hosts: list[tuple[str, dict]]) -> Path:
    path.write_text(f"nodes = {hosts!r}\n")
    return path


def run_provision(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=120)


def test_facts_reports_the_local_machine_over_ssh(sshd, tmp_path):
    inv = write_inventory(tmp_path / "inv.py", [("local", sshd.host_data())])
    result = run_provision("facts", str(inv), "--json")
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["reachable"] is True
    assert host["hostname"] == subprocess.check_output(["hostname"], text=True).strip()
    assert host["kernel"] == subprocess.check_output(["uname", "-r"], text=True).strip()
    assert host["cpu"]["threads"] >= 1
    assert host["memory_bytes"] > 2**30
    root = [d for d in host["block_devices"] if d["is_root"]]
    assert root, "the root disk must be reported as holding data"
    assert root[0]["holds"], "the root disk must be reported as holding data"
    assert any("127.0.0.1/8" not in n["addresses"] for n in host["nics"])


def test_unreachable_host_is_reported_and_does_not_stop_the_others(sshd, tmp_path):
    dead = dict(sshd.host_data(), ssh_port=loopback_sshd.free_port(), cluster_address="127.0.0.2")
    inv = write_inventory(tmp_path / "inv.py", [("local", sshd.host_data()), ("dead", dead)])
    result = run_provision("facts", str(inv), "--json")
    assert result.returncode == 1
    hosts = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts["local"]["reachable"] is True
    assert hosts["dead"]["reachable"] is False
    assert hosts["dead"]["error"]


def test_unknown_host_key_is_refused(sshd, tmp_path):
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    data = dict(sshd.host_data(), ssh_known_hosts_file=str(empty_known_hosts))
    inv = write_inventory(tmp_path / "inv.py", [("local", data)])
    result = run_provision("facts", str(inv), "--json")
    assert result.returncode == 1
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["reachable"] is False


def test_status_reports_no_drift_when_the_venv_matches_the_pins(sshd, tmp_path):
    import torch

    venv = str(Path(sys.executable).parent.parent)
    pinned = torch.__version__.split("+")[0]
    # numpy and nvidia-ml-py are pinned by default too: pin them at this venv's versions.
    pins = {"torch_version": pinned, "numpy_version": version("numpy"), "nvml_version": version("nvidia-ml-py")}
    inv = write_inventory(tmp_path / "inv.py", [("local", dict(sshd.host_data(), venv_path=venv, **pins))])
    result = run_provision("status", str(inv), "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, report
    (host,) = report["hosts"]
    assert host["versions"]["torch"] == torch.__version__
    assert host["drift"] == []


def test_status_names_host_package_and_both_versions_on_drift(sshd, tmp_path):
    import torch

    venv = str(Path(sys.executable).parent.parent)
    inv = write_inventory(
        tmp_path / "inv.py", [("local", dict(sshd.host_data(), venv_path=venv, torch_version="2.0.1"))]
    )
    result = run_provision("status", str(inv))
    assert result.returncode == 1
    flat = " ".join(result.stdout.split())
    assert "drift" in flat
    assert "local" in flat
    assert "torch" in flat
    assert "2.0.1" in flat
    assert torch.__version__ in flat


def test_a_rewritten_known_hosts_file_is_read_again_in_the_same_process(sshd, tmp_path):
    # pyinfra memoizes known_hosts files per process; a testbed VM restarted on a new port
    # gets a new entry, and the next run in the same process (the e2e drills) must see it.
    from pyinfra.facts.server import Hostname

    from provision import engine, inventory

    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = write_inventory(tmp_path / "inv.py", [("local", dict(sshd.host_data(), ssh_known_hosts_file=str(known)))])
    wanted = {"hostname": (Hostname, {})}
    before = engine.gather_facts(list(inventory.load(inv).nodes), wanted)
    assert "local" in before.failed
    known.write_text(sshd.known_hosts.read_text())
    after = engine.gather_facts(list(inventory.load(inv).nodes), wanted)
    assert after.failed == {}
    assert after.facts["local"]["hostname"] == subprocess.check_output(["hostname"], text=True).strip()


def _local_and_second_host(sshd, tmp_path, name: str, env: dict[str, str]):
    """An inventory of "local" and a second host `name` on the same sshd, reached as
    "localhost" (every host needs its own address), whose commands get `env`."""
    known = tmp_path / "known_hosts"
    lines = sshd.known_hosts.read_text()
    known.write_text(lines + lines.replace("127.0.0.1", "localhost"))
    second = dict(
        sshd.host_data(),
        ssh_hostname="localhost",
        ssh_known_hosts_file=str(known),
        cluster_address="127.0.0.2",
        _env=env,
    )
    return write_inventory(tmp_path / "inv.py", [("local", sshd.host_data()), (name, second)])


def test_a_fact_failing_on_one_host_leaves_the_others_their_facts(sshd, tmp_path):
    # A host that answers SSH but fails a fact (a missing tool, a dropped connection) is
    # reported as failed; the other host still gets every fact. Both hosts are this sshd;
    # host data's _env makes the stand-in fact's command fail on "broken" only.
    from pyinfra.api import FactBase
    from pyinfra.facts.server import Hostname

    from provision import engine, inventory

    class TestStandInFailsWhenAsked(FactBase):
        def command(self) -> str:
            return 'test -z "$PROVISION_TEST_FAIL" && echo fine'

        def process(self, output):
            return output[0]

    inv = _local_and_second_host(sshd, tmp_path, "broken", {"PROVISION_TEST_FAIL": "1"})
    wanted = {"hostname": (Hostname, {}), "probe": (TestStandInFailsWhenAsked, {})}
    result = engine.gather_facts(list(inventory.load(inv).nodes), wanted)
    assert result.facts["local"]["probe"] == "fine"
    assert "broken" not in result.facts
    assert result.failed["broken"].startswith("fact probe")


def test_accept_new_trusts_a_new_host_once_and_refuses_a_changed_key(sshd, tmp_path):
    # StrictHostKeyChecking=accept-new, as OpenSSH means it, for the fabric side (validate,
    # train, backup): the first key is saved and pinned; a different key later is refused.
    from provision import inventory, remote

    known = tmp_path / "known_hosts"
    inv = write_inventory(
        tmp_path / "inv.py",
        [("local", dict(sshd.host_data(), ssh_known_hosts_file=str(known), ssh_strict_host_key_checking="accept-new"))],
    )
    node = inventory.load(inv).node("local")
    assert remote.run(node, "echo first").stdout.strip() == "first"
    saved = known.read_text()
    name, key_type, _ = saved.split()[:3]
    assert name == f"[127.0.0.1]:{sshd.port}"
    assert remote.run(node, "echo again").stdout.strip() == "again"
    assert known.read_text() == saved
    # Another key of the same type for the same host: a man in the middle, or a reinstalled server.
    kind = {"ssh-ed25519": "ed25519", "ecdsa-sha2-nistp256": "ecdsa", "ssh-rsa": "rsa"}[key_type]
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(tmp_path / "forged")], check=True)
    forged = (tmp_path / "forged.pub").read_text().split()[1]
    known.write_text(f"{name} {key_type} {forged}\n")
    refused = remote.run(node, "echo should-not-run")
    assert refused.exited == -1
    assert "should-not-run" not in refused.stdout


def test_a_host_that_hangs_fails_at_the_deadline_and_the_others_keep_their_facts(sshd, tmp_path):
    # One host's fact never answers (a wedged disk, say): the gather gives up on that host
    # at its deadline, says which fact it was waiting for, and still returns the other's.
    from pyinfra.api import FactBase

    from provision import engine, inventory

    class TestStandInHangsWhenAsked(FactBase):
        def command(self) -> str:
            return 'if [ -n "$PROVISION_TEST_HANG" ]; then sleep 600; fi; echo fine'

        def process(self, output):
            return output[0]

    inv = _local_and_second_host(sshd, tmp_path, "hung", {"PROVISION_TEST_HANG": "1"})
    wanted = {"probe": (TestStandInHangsWhenAsked, {})}
    result = engine.gather_facts(list(inventory.load(inv).nodes), wanted, timeout_s=5, fact_timeout_s=60)
    assert result.facts == {"local": {"probe": "fine"}}
    assert result.failed == {"hung": "timed out in fact probe after 5 s"}


def _markers_then(sshd, tmp_path, lines: str, mode: str) -> tuple[Path, Path]:
    """known_hosts that opens with OpenSSH's marker lines (a CA and a revoked key of
    someone else's), then ``lines``; an inventory of the loopback host using it."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "ca")], check=True)
    ca = (tmp_path / "ca.pub").read_text().split()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority *.example.com ssh-ed25519 {ca}\n@revoked * ssh-ed25519 {ca}\n{lines}")
    data = dict(sshd.host_data(), ssh_known_hosts_file=str(known), ssh_strict_host_key_checking=mode)
    return write_inventory(tmp_path / "inv.py", [("local", data)]), known


def _both_seams(inv: Path) -> tuple[bool, bool]:
    """(pyinfra's facts reached the host, fabric's command ran on it)."""
    from pyinfra.facts.server import Hostname

    from provision import engine, inventory, remote

    node = inventory.load(inv).node("local")
    facts = engine.gather_facts([node], {"hostname": (Hostname, {})})
    ran = remote.run(node, "echo reached").stdout.strip() == "reached"
    return "local" in facts.facts, ran


def _forged_key(sshd, tmp_path) -> str:
    """The host's known_hosts line with another key of the same type in place of its own."""
    name, key_type, _ = sshd.known_hosts.read_text().split()[:3]
    kind = {"ssh-ed25519": "ed25519", "ecdsa-sha2-nistp256": "ecdsa", "ssh-rsa": "rsa"}[key_type]
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(tmp_path / "forged")], check=True)
    return f"{name} {key_type} {(tmp_path / 'forged.pub').read_text().split()[1]}\n"


def test_keys_after_marker_lines_are_read_by_both_seams(sshd, tmp_path):
    inv, _ = _markers_then(sshd, tmp_path, sshd.known_hosts.read_text(), "yes")
    assert _both_seams(inv) == (True, True)


def test_a_changed_key_after_marker_lines_is_refused_by_both_seams_even_under_accept_new(sshd, tmp_path):
    inv, known = _markers_then(sshd, tmp_path, _forged_key(sshd, tmp_path), "accept-new")
    before = known.read_text()
    assert _both_seams(inv) == (False, False)
    assert known.read_text() == before  # nothing accepted, the marker lines kept


def test_a_revoked_host_key_is_refused_by_both_seams_even_under_accept_new(sshd, tmp_path):
    _, key_type, key = sshd.known_hosts.read_text().split()[:3]
    inv, known = _markers_then(sshd, tmp_path, f"@revoked * {key_type} {key}\n", "accept-new")
    before = known.read_text()
    assert _both_seams(inv) == (False, False)
    assert known.read_text() == before


def test_accept_new_appends_a_new_host_and_keeps_the_marker_lines_on_both_seams(sshd, tmp_path):
    inv, known = _markers_then(sshd, tmp_path, "", "accept-new")
    before = known.read_text()
    assert _both_seams(inv) == (True, True)
    after = known.read_text()
    assert after.startswith(before)
    assert after[len(before) :].split()[0] == f"[127.0.0.1]:{sshd.port}"


def test_facts_asked_in_one_command_keep_their_own_meaning_on_a_real_shell(sshd, tmp_path):
    # gather_facts asks a host's facts in one command (engine/fact_batch.py): through a
    # real sshd and sh, the parts' outputs reach their own facts, and a part whose required
    # tool is missing fails that host naming the fact and the tool.
    from pyinfra.api import FactBase
    from pyinfra.facts.server import Hostname

    from provision import engine, inventory
    from provision.facts.system import Memory

    class TestStandInNeedsAMissingTool(FactBase):
        def requires_command(self) -> str:
            return "provision-no-such-tool"

        def command(self) -> str:
            return "provision-no-such-tool --list"

        def process(self, output):
            return output

    inv = write_inventory(tmp_path / "inv.py", [("local", sshd.host_data())])
    nodes = list(inventory.load(inv).nodes)
    both = engine.gather_facts(nodes, {"hostname": (Hostname, {}), "memory": (Memory, {})})
    assert both.facts["local"]["hostname"] == subprocess.check_output(["hostname"], text=True).strip()
    assert both.facts["local"]["memory"] > 0
    missing = engine.gather_facts(nodes, {"hostname": (Hostname, {}), "tool": (TestStandInNeedsAMissingTool, {})})
    assert missing.failed == {"local": "fact tool: MissingCommandError: provision-no-such-tool"}
