"""The bad-input suite: every case is an inventory a careless user or an attacker could
write. Each runs the real CLI (in this process for all of them, and as a spawned
`python -m provision` for a representative subset across plan, up, validate, facts and
inventory check) against hosts that point at a loopback listener counting connections,
and must: exit 2; say each problem on one line naming the file, and the host and key
where there is one; print no traceback and nothing on stdout; connect to nothing; and,
for an injection case, leave its marker file uncreated."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.unit.test_inventory import ConnectionCounter

ROOT = Path(__file__).resolve().parents[2]
M = "{MARKER}"  # replaced by the case's own marker file: created only if a value ran in a shell


@dataclass(frozen=True)
class Case:
    """One bad inventory and the problem it must be refused with."""

    id: str  # the test id
    expect: str  # a substring of one problem line: "host n1: key venv_path"
    host: dict[str, object] = field(default_factory=dict)  # extra data of host n1
    extra: str = ""  # more inventory text (groups), after the hosts
    group_data: dict[str, str] = field(default_factory=dict)  # group_data/<name>.py -> text
    name: str = "n1"  # host n1's name in the inventory
    whole: str | None = None  # the whole inventory text instead of the generated one


def _key(key: str, *values: object, host: str = "n1") -> list[Case]:
    return [Case(f"{key}-{i}", f"host {host}: key {key}", {key: v}) for i, v in enumerate(values)]


PATHS = ["relative/dir", "/", "/etc", "/data/../etc", "/da ta", "/data\nx", f"/opt/$(touch {M})venv", f"/d;touch {M}"]
CASES: list[Case] = [
    *_key("venv_path", *PATHS, "/usr", "/var"),
    *_key("data_mount", *PATHS, "/boot/x", "/proc/1", "/home"),
    *_key("nfs_mount_root", "/", "/etc", "/sys", f"/s`touch {M}`"),
    *_key("nfs_export_root", "/", "/root/x", "/x//y", f"/e$(touch {M})"),
    *_key("train_dir", "/", "/tmp", "/var/tmp", "rel", f"/t$(touch {M})"),
    *_key("backup_paths", [f"/x;touch {M}"], ["relative"], ["/"], ["/proc"], ["/a b"], "/home"),
    *_key("backup_schedule", f"daily\nExecStartPre=/bin/touch {M}", f"daily; touch {M}", f"$(touch {M})", ""),
    *_key("backup_repository", f"sftp:x@h:/r$(touch {M})", f"/r;touch {M}", f"s3:b`touch {M}`", "ftp://x", "/r r"),
    *_key("ssh_user", f"root\n  ProxyCommand touch {M}", "r oot", f"$(touch {M})", "-oProxyCommand=x", 5),
    *_key("ssh_hostname", f"127.0.0.1\nProxyCommand touch {M}", "host name", "a;b", "http://x"),
    *_key("ssh_known_hosts_file", f"/kh\nProxyCommand touch {M}", ""),
    *_key("ssh_port", "22", 0, 70000),
    *_key("training_user", f"t;touch {M}", "Train User", "-x", "", f"$(touch {M})"),
    *_key("training_uid", 0, 65534, 100, -1, True),
    *_key("cluster_interface", f"eth0;touch {M}", "averyveryverylongname", "eth 0", ".."),
    *_key("cluster_cidr", "0.0.0.0/0", "10.0.0.0/4", "::/0", "192.168.0.0/24", "10.9.0.0/33", "garbage"),
    *_key("cluster_address", "10.9.0.1;x", "not-an-ip", f"$(touch {M})"),
    *_key("nfs_exports", ["../../../etc"], ["a/b"], [".."], ["a b"], ["x", "x"], [f"$(touch {M})"]),
    *_key("exporter_collectors", ["cpu --web.listen-address=0.0.0.0:9100"], [f"cpu;touch {M}"], "cpu", ["CPU"], [5]),
    *_key("gpu_telemetry", "dcgm", "", True),
    *_key("nfs_export_options", "rw,no_root_squash", "rw) *(rw,no_root_squash", "rw,sync\n/etc *(rw)", "rw insecure"),
    *_key("nfs_server", "n1;x", "ghost"),
    *_key("ntp_servers", [f"pool.ntp.org;touch {M}"], ["a b"], "pool.ntp.org"),
    *_key("pip_index_url", f"http://x/$(touch {M})", "ftp://x"),
    *_key("nvidia_repo_url", "https://x/ y", f"https://x/$(touch {M})"),
    *_key("nvidia_keyring_url", f"file:///etc/passwd;touch {M}"),
    *_key("min_root_free_gb", 0, -5, 10**9),
    *_key("apt_lock_wait_s", 1e9, 0),
    *_key("reboot_timeout_s", 0),
    *_key("backup_keep_daily", 0),
    *_key("train_master_port", 70000, 0),
    *_key("nofile_limit", 2**30),
    *_key("torch_version", f"2.0; touch {M}"),
    *_key("numpy_version", f"$(touch {M})"),
    *_key("nvidia_driver_branch", "580;x"),
    *_key("cuda_toolkit_version", "12-8 && x"),
    *_key("nccl_version", "x y"),
    *_key("data_disks", ["/dev/sdb"], [f"disk;touch {M}"], ["a b"], "all"),
    *_key("force_format", [f"$(touch {M})"]),
    *_key("nvidia", "yes"),
    *_key("filesystem", "btrfs"),
    *_key("raid_level", 3),
    Case("unknown-key", "host n1: key venv_pth", {"venv_pth": "/opt/v"}),
    Case("unknown-key-newline", "host n1: key 'a\\nProxyCommand x'", {"a\nProxyCommand x": 1}),
    Case(
        "validate-expect-nan",
        "host n1: key validate_expect",
        whole="nodes = [('n1', {'validate_expect': {'x': float('nan')}})]",
    ),
    *[
        Case(f"host-name-{i}", f"host {name!a}: ", name=name)
        for i, name in enumerate(
            ["nöde1", "gpu 01", "a/b", f"n\nProxyCommand touch {M}", "-lead", "under_score", "x" * 64, "a..b", "../x"]
        )
    ],
    Case("group-string", "group storage: is a str, not a list of hosts", extra='storage = "n1"'),
    Case("group-dict", "group storage: is a dict, not a list of hosts", extra='storage = {"n1": {}}'),
    Case("group-tuple", "group gpu_nodes: is a tuple but not", extra='gpu_nodes = ("n1",)'),
    Case("group-int-entry", "group storage: entry 1", extra="storage = [1]"),
    Case("file-sys-exit", "the inventory called sys.exit(0)", whole="import sys\nnodes = ['n1']\nsys.exit(0)"),
    Case("file-loops", "took longer than", whole="while True:\n    pass"),
    Case("file-sleeps", "took longer than", whole="import time\nwhile True:\n    time.sleep(0.01)"),
    Case("file-raises", "raised ValueError: boom", whole="raise ValueError('boom')"),
    Case("file-syntax", "syntax error", whole="nodes = [("),
    Case("file-no-hosts", "the inventory has no hosts", whole="_x = 1"),
    Case("group-data-all", "group_data/all.py: key venv_path", group_data={"all": f"venv_path = '/v$(touch {M})'"}),
    Case(
        "group-data-storage",
        "group_data/storage.py: key data_mount",
        extra="storage = ['n1']",
        group_data={"storage": "data_mount = '/'"},
    ),
    Case("nfs-without-cidr", "host n1: key cluster_cidr: cluster_cidr is not set", extra="storage = ['n1']"),
    Case(
        "password-missing",
        "host n1: key backup_password_file",
        {"backup_password_file": "/nonexistent/pw", "backup_paths": ["/home"]},
    ),
    Case(
        "password-empty",
        "host n1: key backup_password_file",
        {"backup_password_file": "{EMPTY}", "backup_paths": ["/home"]},
    ),
    Case("wheelhouse-empty", "host n1: key wheelhouse", {"wheelhouse": "{WHEELS_NONE}"}),
    Case("wheelhouse-no-torch", "host n1: key wheelhouse: ", {"wheelhouse": "{WHEELS_NUMPY}"}),
    Case("backup-no-repository", "host n1: key backup_repository", {"backup_paths": ["/home"]}),
    # An install from an index is checked against a lock; the lock widens nothing.
    Case("pip-no-lock", "hosts n1, n2: key pip_lock_file: pip would install from an index without checking"),
    *_key("pip_lock_file", "/nonexistent/lock.txt", "/dev/zero", "{LOCK_DIR}", "{LOCK_OPTIONS}", "{LOCK_UNHASHED}"),
    *_key("pip_lock_file", "/l\nx", ""),
    *_key("pip_require_hashes", "no", 0),
]
INJECTIONS = {c.id for c in CASES if M in repr(c)}

# Through a spawned `python -m provision`: one or more of each class, across the commands.
SPAWNED: list[tuple[str, str]] = [
    ("venv_path-6", "plan"),
    ("venv_path-7", "up"),
    ("data_mount-1", "up"),
    ("data_mount-7", "plan"),
    ("backup_paths-0", "up"),
    ("backup_schedule-0", "plan"),
    ("backup_repository-0", "up"),
    ("ssh_user-0", "validate"),
    ("ssh_hostname-0", "facts"),
    ("host-name-0", "validate"),
    ("host-name-1", "inventory check"),
    ("host-name-2", "facts"),
    ("host-name-3", "validate"),
    ("cluster_cidr-0", "up"),
    ("cluster_cidr-3", "plan"),
    ("nfs_exports-0", "up"),
    ("nfs_export_options-1", "plan"),
    ("training_uid-0", "up"),
    ("group-string", "inventory check"),
    ("group-dict", "plan"),
    ("file-sys-exit", "inventory check"),
    ("file-loops", "up"),
    ("password-empty", "up"),
    ("wheelhouse-no-torch", "plan"),
    ("nfs-without-cidr", "up"),
    ("train_dir-4", "validate"),
    ("pip-no-lock", "up"),
    ("pip_lock_file-3", "plan"),
]
BY_ID = {c.id: c for c in CASES}


def _value(value: object, files: dict[str, str]) -> object:
    if isinstance(value, str):
        for placeholder, path in files.items():
            value = value.replace(placeholder, path)
        return value
    if isinstance(value, list):
        return [_value(v, files) for v in value]
    return value


def _write(case: Case, tmp_path: Path, port: int) -> tuple[Path, Path]:
    """The case's inventory (hosts at the listener), and its marker file's path."""
    marker = tmp_path / "marker"
    files = {M: str(marker), **_side_files(tmp_path)}
    inv = tmp_path / "inv.py"
    if case.whole is not None:
        inv.write_text(case.whole + "\n")
    else:
        base = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_strict_host_key_checking": "no"}
        n1 = {**base, "cluster_address": "10.9.0.1", **{k: _value(v, files) for k, v in case.host.items()}}
        n2 = {**base, "ssh_hostname": "localhost", "cluster_address": "10.9.0.2"}  # same listener, own address
        name = _value(case.name, files)
        inv.write_text(f"nodes = [({name!r}, {n1!r}), ('n2', {n2!r})]\n{case.extra}\n")
    for group, text in case.group_data.items():
        (tmp_path / "group_data").mkdir(exist_ok=True)
        (tmp_path / "group_data" / f"{group}.py").write_text(str(_value(text, files)) + "\n")
    return inv, marker


def _side_files(tmp_path: Path) -> dict[str, str]:
    """Files some cases point at: an empty password file, wheelhouses lacking wheels."""
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "wheels-none").mkdir(exist_ok=True)
    (tmp_path / "wheels-numpy").mkdir(exist_ok=True)
    (tmp_path / "wheels-numpy" / "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"")
    hashed = f" --hash=sha256:{'a' * 64}"
    pins = f"torch==2.13.0{hashed}\nnumpy==2.2.6{hashed}\nnvidia-ml-py==13.580.126{hashed}\n"
    (tmp_path / "lock-options.txt").write_text(f"--extra-index-url http://10.9.9.9/simple\n-e .\n{pins}")
    (tmp_path / "lock-unhashed.txt").write_text("torch==2.13.0\nnumpy==2.2.6\nnvidia-ml-py==13.580.126\n")
    return {
        "{LOCK_DIR}": str(tmp_path),
        "{LOCK_OPTIONS}": str(tmp_path / "lock-options.txt"),
        "{LOCK_UNHASHED}": str(tmp_path / "lock-unhashed.txt"),
        "{EMPTY}": str(tmp_path / "empty"),
        "{WHEELS_NONE}": str(tmp_path / "wheels-none"),
        "{WHEELS_NUMPY}": str(tmp_path / "wheels-numpy"),
    }


def _check(case: Case, inv: Path, marker: Path, code: int, out: str, err: str, connections: int) -> None:
    assert code == 2, err
    assert "Traceback" not in out + err
    assert out == ""
    problems = [line for line in err.splitlines() if line.startswith("error: ")]
    assert problems, err
    # One line per problem, each naming its file (the inventory or its group_data).
    assert all(f"{inv}" in line or "group_data/" in line or "inv.py" in line for line in problems), problems
    assert all(ch >= " " or ch == "\t" for line in problems for ch in line), problems
    expect = case.expect.replace(M, str(marker))
    assert any(expect in line for line in problems), problems
    assert connections == 0
    assert not marker.exists()


class _Listener:
    """This test's view of the module's listener: connections since the test began."""

    def __init__(self, counter: ConnectionCounter):
        self.counter, self.port, self.start = counter, counter.port, counter.count

    @property
    def count(self) -> int:
        return self.counter.count - self.start


@pytest.fixture(scope="module")
def _counter():
    counter = ConnectionCounter()
    yield counter
    counter.close()


@pytest.fixture
def listener(_counter):
    return _Listener(_counter)


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    # Short, so the looping inventories cost seconds; not 1 s: on a loaded 2-core CI machine
    # a plain inventory's load once took longer than that (a clean-clone run, session 27).
    monkeypatch.setenv("PROVISION_INVENTORY_TIMEOUT_S", "5")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_inventory_check_refuses_each_bad_input_before_any_host(case, tmp_path, listener, cli):
    inv, marker = _write(case, tmp_path, listener.port)
    result = cli("inventory", "check", "--json", str(inv))
    _check(case, inv, marker, result.code, result.out, result.err, listener.count)


@pytest.mark.parametrize(("case_id", "command"), SPAWNED, ids=[f"{c}-{cmd.replace(' ', '-')}" for c, cmd in SPAWNED])
def test_every_command_refuses_bad_input_in_a_fresh_process(case_id, command, tmp_path, listener):
    case = BY_ID[case_id]
    inv, marker = _write(case, tmp_path, listener.port)
    args = [*command.split(), str(inv)] + (["--json"] if command in ("inventory check", "up", "plan") else [])
    done = subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    _check(case, inv, marker, done.returncode, done.stdout, done.stderr, listener.count)


def test_the_suite_has_at_least_100_cases_and_its_injections_carry_markers():
    assert len(CASES) >= 100
    assert len(INJECTIONS) >= 30
    assert {c for c, _ in SPAWNED} <= set(BY_ID)
