"""No value reaches a shell unquoted: each builder of a command or of a file that sh reads
is fed values full of shell metacharacters, bypassing the settings' own checks (Settings
built directly), and the text it builds still parses back (shlex) with every value one
word, exactly as given. Validation at load (tests/unit/test_values.py) refuses these
values anyway; this is the second wall."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from provision.deploys import backups, nfs
from provision.facts.stack import stack_command
from provision.facts.venv import TorchCheck, VenvPackages, WheelSizes
from provision.inventory import Cluster, Node, SshTarget
from provision.operations.venv import install_command
from provision.operations.volumes import fstab_line
from provision.remote import ssh_config
from provision.rules import backups as backup_layout
from provision.rules.frameworks import pip_source_args
from provision.settings import Settings
from provision.validate.controller import Plan, agent_command

# Each would run a command, split a word or end a line if it reached sh unquoted.
NASTY = [
    "/opt/$(touch /tmp/provision-quoting-marker)venv",
    "/data;touch /tmp/provision-quoting-marker",
    "/with space",
    "/back`id`tick",
    "/single'quote",
    '/double"quote',
    "/pipe|and&redirect>x",
    "/new\nline",
    "/glob*?[x]",
    "/dollar$HOME",
]


def _words(command: str) -> list[str]:
    return shlex.split(command, comments=False, posix=True)


@pytest.mark.parametrize("value", NASTY)
def test_venv_facts_and_pip_install_keep_the_venv_path_one_word(value):
    pip, python = f"{value}/bin/pip", f"{value}/bin/python"
    assert _words(VenvPackages().command(pip))[0] == pip
    assert _words(TorchCheck().command(python, need_cuda=False))[0] == python
    assert _words(WheelSizes().command(value))[1] == value
    words = _words(install_command(pip, [f"torch=={value}"], None))
    assert words == [pip, "install", f"torch=={value}"]


@pytest.mark.parametrize("value", NASTY)
def test_pip_index_url_is_one_word(value):
    words = _words(pip_source_args(Settings(pip_index_url=value)) or "")
    assert words[-2:] == ["--index-url", value]
    assert all(w.startswith("--") for w in words[:-1])  # the value added no word of its own


SAFE = "/plain-value"


def _skeleton(text: str, value: str) -> str:
    for suffix in ("/bin/python", "/bin/pip", ""):
        text = text.replace(shlex.quote(value + suffix), f"<VALUE{suffix}>")
    return text


def _same_structure(build, value: str) -> bool:
    """What the builder makes of ``value`` is what it makes of a plain value, once each
    quoted occurrence is taken out: the value only ever went in as one quoted word."""
    return _skeleton(build(value), value) == _skeleton(build(SAFE), SAFE)


@pytest.mark.parametrize("value", NASTY)
def test_status_probe_quotes_the_venv_and_every_mount_point(value):
    assert _same_structure(lambda v: stack_command(v, [v]), value)


@pytest.mark.parametrize("value", NASTY)
def test_validate_agent_command_keeps_venv_and_data_mount_one_word(value):
    node = Node(
        "n1", SshTarget("10.0.0.1", 22, None, None, None, "yes"), (), Settings(venv_path=value, data_mount=value)
    )
    words = _words(agent_command(node, "/tmp/agent.py", Plan(mode="quick", groups=frozenset({"cpu"}))))
    assert words[0] == f"P={value}/bin/python;"
    assert words[words.index("--data-dir") + 1] == value


def _backup_node(**kw: object) -> tuple[Node, Cluster]:
    settings = Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24", **kw)  # type: ignore[arg-type]
    node = Node("node1", SshTarget("node1", 22, "root", None, None, "yes"), ("storage",), settings)
    return node, Cluster(Path("/nonexistent/inv.py"), (node,))


@pytest.mark.parametrize("value", NASTY)
def test_restic_env_file_sourced_by_sh_holds_each_value_as_one_assignment(value, monkeypatch, tmp_path):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path))

    def env(v: str) -> str:
        node, cluster = _backup_node(backup_repository=v)
        return backups.unit_files(node, cluster)[backup_layout.ENV_FILE]

    assert _same_structure(env, value)


@pytest.mark.parametrize("value", NASTY)
def test_backup_script_passes_each_path_and_host_as_one_word(value, monkeypatch, tmp_path):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path))

    def script(v: str) -> str:
        node, cluster = _backup_node(backup_paths=[v, "/home"])
        return backups.unit_files(node, cluster)[backup_layout.SCRIPT]

    assert _same_structure(script, value)


@pytest.mark.parametrize("value", NASTY)
def test_fstab_lines_keep_six_fields(value):
    settings = Settings(data_mount=value, nfs_export_root=value, nfs_mount_root=value, nfs_exports=["a"])
    for line in (
        fstab_line("1234-abcd", settings),
        nfs.client_fstab_line("10.0.0.1", settings, settings, "a"),
        nfs.bind_fstab_line(settings),
    ):
        assert "\n" not in line
        assert len(line.split()) == 6


@pytest.mark.parametrize("value", NASTY)
def test_exports_file_keeps_one_line_per_share(value):
    text = nfs.exports_text(Settings(nfs_export_root=value, nfs_exports=["a"], cluster_cidr="10.0.0.0/24"))
    (line,) = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(line.split()) == 2


@pytest.mark.parametrize("field", ["name", "hostname", "user", "key"])
def test_ssh_config_for_verify_never_gains_a_directive_from_a_value(field):
    evil = "x\n  ProxyCommand touch /tmp/provision-quoting-marker"
    ssh = {"hostname": "10.0.0.1", "user": "root", "key": "/k"} | ({field: evil} if field != "name" else {})
    target = SshTarget(ssh["hostname"], 22, ssh["user"], ssh["key"], "/kh", "yes")
    node = Node(evil if field == "name" else "n1", target, (), Settings())
    with pytest.raises(ValueError, match="cannot be written into an ssh_config"):
        ssh_config([node])


def test_ssh_config_quotes_a_path_with_spaces():
    node = Node("n1", SshTarget("10.0.0.1", 22, "root", "/keys/my key", "/kh", "yes"), (), Settings())
    assert '  IdentityFile "/keys/my key"' in ssh_config([node]).splitlines()


@pytest.mark.parametrize("value", NASTY)
def test_the_host_locks_holder_text_is_one_word(value):
    from provision.up import host_lock

    script = host_lock.lock_script(f"provision up of {value}", "0123abcd")
    words = _words(script)
    at = words.index("printf")
    assert words[at : at + 4] == ["printf", "%s [run %s]\\n", f"provision up of {value}", "0123abcd"]
