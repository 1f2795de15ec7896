"""Reliability drills on the shared testbed (issue: demo and status).

- A bad inventory of every class: one clear line, exit code 2, and no host contacted --
  shown by the VMs' own sshd logs, which record no new connection.
- The NFS server hangs (its VM frozen): the client's node collector still ends within its
  deadlines and reads every share as missing; once the server answers again, as mounted.
- The NFS server reboots while a client reads a file: the read completes after the server
  returns, and not a byte is lost.

Killing a VM mid-`up` lives in test_up_kill_node.py; mid-`train` in test_train_e2e.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from provision import inventory, remote
from provision.rules import monitoring
from provision.testbed import node as tb_node
from provision.testbed import qemu
from tests.e2e.storage_helpers import cli, sh


def sshd_cursor(node) -> str:
    """The journal position of the guest's sshd log, to read only what comes after it."""
    out = sh(node, "journalctl -u ssh.service -n 0 --show-cursor --no-pager")
    return out.strip().splitlines()[-1].split("cursor: ", 1)[1]


def sshd_lines_since(node, cursor: str) -> list[str]:
    out = sh(node, f"journalctl -u ssh.service --after-cursor='{cursor}' -o cat --no-pager")
    return [line for line in out.splitlines() if line.strip()]


def bad_inventories(source: Path, dest: Path) -> dict[str, str]:
    """One inventory per class of bad input, built from the testbed's real host data, so
    that a tool which ignored the problem would reach real, answering hosts."""
    ns: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), ns)
    (n1, d1), (n2, d2) = ns["nodes"][:2]
    ok = f"nodes = [({n1!r}, {d1!r}), ({n2!r}, {d2!r})]\n"
    variants = {
        "syntax error": ok.replace("]\n", "\n"),
        "raises on import": ok + "raise RuntimeError('inventory generator failed')\n",
        "unknown key": f"nodes = [({n1!r}, {d1!r}), ({n2!r}, dict({d2!r}, data_mout='/data'))]\n",
        "wrong type": f"nodes = [({n1!r}, {d1!r}), ({n2!r}, dict({d2!r}, raid_level='zero'))]\n",
        "missing ssh key": f"nodes = [({n1!r}, {d1!r}), ({n2!r}, dict({d2!r}, ssh_key='/nonexistent/id'))]\n",
        "duplicate host": f"nodes = [({n1!r}, {d1!r}), ({n2!r}, {d2!r}), {n2!r}]\n",
        "duplicate cluster address": f"nodes = [({n1!r}, {d1!r}), ({n2!r}, dict({d2!r}, "
        f"cluster_address={d1['cluster_address']!r}))]\n",
        "empty": "nodes = []\n",
    }
    paths = {}
    for name, text in variants.items():
        path = dest / f"bad_{name.replace(' ', '_')}.py"
        path.write_text(text)
        paths[name] = str(path)
    paths["missing file"] = str(dest / "no_such_inventory.py")
    return paths


def test_bad_inventory_of_every_class_exits_2_and_contacts_no_host(testbed, tmp_path):
    cluster = inventory.load(testbed.inventory_path)
    cursors = {n.name: sshd_cursor(n) for n in cluster.nodes}
    outcomes = {}
    for name, path in bad_inventories(Path(testbed.inventory_path), tmp_path).items():
        run = cli("up", path, timeout_s=120)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        outcomes[name] = (run.exit_code, lines)
    for name, (code, lines) in outcomes.items():
        assert code == 2, (name, lines)
        assert lines, (name, lines)
        assert all(line.startswith("error: ") for line in lines), (name, lines)
        assert not any("Traceback" in line for line in lines), name
    for node in cluster.nodes:
        new = sshd_lines_since(node, cursors[node.name])
        # The only new login is the one reading the log now; a run that had contacted the
        # host would have left an "Accepted publickey" or a "[preauth]" line of its own.
        assert sum("Accepted publickey" in line for line in new) == 1, (node.name, new)
        assert not any("[preauth]" in line for line in new), (node.name, new)


def wait_for_new_boot(node, old_boot_id: str, timeout_s: float) -> None:
    """Until the node answers with another boot id: its old sshd may answer for a moment
    after the reboot was asked for, so an SSH login alone proves nothing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = remote.run(node, "cat /proc/sys/kernel/random/boot_id", timeout=15)
        if answer.ok and answer.stdout.strip() != old_boot_id:
            return
        time.sleep(5)
    raise AssertionError(f"{node.name} did not come back from its reboot within {timeout_s:.0f}s")


def _wait_for_file(node, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not remote.run(node, f"test -e {path}", timeout=15).ok:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node.name}: no {path} within {timeout_s:.0f}s")
        time.sleep(0.5)


# The node collector's waits with the NFS server hung (templates/monitoring/node-metrics.j2):
# one `stat -f` of the shares (10 s, SIGKILL 2 s later) and Slurm's `scontrol` (10 s; its
# controller is the same VM here). 20.4 s when it was measured by hand (BENCHMARKS.md).
COLLECTOR_WAITS_S = 10 + 2 + 10 + 2
PRESENT = re.compile(r'^provision_nfs_mount_present\{path="([^"]+)"\} ([01])$', re.M)


def _shares_present(client) -> dict[str, str]:
    prom = sh(client, f"cat {monitoring.TEXTFILE_DIR}/provision_node.prom")
    return dict(PRESENT.findall(prom))


@pytest.mark.destructive
def test_a_hung_nfs_server_costs_the_clients_collector_its_deadline_and_reads_as_missing(provisioned, testbed):
    """The server's VM frozen (QMP `stop`: its connections open, nothing answers), as a hung
    NFS server is: a hard mount's `stat` would wait forever. The client's collector, run as
    its timer runs it, ends within its own deadlines and says each share is missing (a hung
    hard mount stays in the mount table, so the table alone would say mounted)."""
    cluster = inventory.load(testbed.inventory_path)
    server = cluster.storage_node()
    assert server is not None
    client = next(n for n in cluster.nodes if n.name != server.name)
    sh(client, monitoring.NODE_COLLECTOR)
    before = _shares_present(client)
    assert len(before) >= 1, before  # the client's shares: datasets, checkpoints, ...
    assert set(before.values()) == {"1"}, before
    sock = tb_node.files(testbed.testbed.state_dir, server.name).dir / "qmp.sock"
    qemu.qmp(sock, "stop")
    try:
        start = time.monotonic()
        ran = remote.run(client, monitoring.NODE_COLLECTOR, timeout=120)
        took = time.monotonic() - start
        hung = _shares_present(client)
    finally:
        qemu.qmp(sock, "cont")
    print(f"collector with the NFS server frozen: {took:.1f} s, shares {hung}")
    assert ran.ok, ran.stderr[-2000:]
    assert took < COLLECTOR_WAITS_S + 30, took  # its deadlines, and SSH and bash under TCG
    assert hung == dict.fromkeys(before, "0"), hung
    # Answering again: the next pass reads them mounted (the hard mounts recover by themselves).
    deadline = time.monotonic() + 120
    while _shares_present(client) != before:
        assert time.monotonic() < deadline, _shares_present(client)
        sh(client, monitoring.NODE_COLLECTOR)


@pytest.mark.destructive
def test_nfs_server_reboot_while_a_client_reads(provisioned, testbed):
    cluster = inventory.load(testbed.inventory_path)
    server = cluster.storage_node()
    assert server is not None
    client = next(n for n in cluster.nodes if n.name != server.name)
    share = f"{client.settings.nfs_mount_root}/datasets"
    # The exports squash root, so the shares are written as the training user (who owns them).
    user = client.settings.training_user
    # 64 MiB of random data, written through the client so both sides see the same file.
    sh(client, f"runuser -u {user} -- sh -c 'head -c 67108864 /dev/urandom > {share}/drill.bin' && sync")
    expected = sh(server, f"sha256sum {server.settings.nfs_export_root}/datasets/drill.bin").split()[0]
    # A slow reader: 1 MiB every 0.2 s (about 13 s of reading), so the reboot lands mid-read.
    # It leaves /root/drill.reading once its first MiB is in, so the reboot waits for a
    # read under way instead of a fixed sleep.
    reader = (
        "import hashlib, time\n"
        f"h = hashlib.sha256(); f = open('{share}/drill.bin', 'rb')\n"
        "while chunk := f.read(1 << 20):\n"
        "    h.update(chunk); open('/root/drill.reading', 'w').close(); time.sleep(0.2)\n"
        "open('/root/drill.sha256', 'w').write(h.hexdigest())\n"
    )
    sh(client, "rm -f /root/drill.sha256 /root/drill.reading")
    sh(client, f'nohup python3 -c "{reader}" > /root/drill.log 2>&1 & echo started')
    _wait_for_file(client, "/root/drill.reading", timeout_s=60)
    boot_id = sh(server, "cat /proc/sys/kernel/random/boot_id").strip()
    remote.run(server, "systemctl reboot", timeout=20)  # the connection drops: expected
    wait_for_new_boot(server, boot_id, timeout_s=600)
    deadline = time.monotonic() + 600
    digest = ""
    while time.monotonic() < deadline and not digest:
        digest = remote.run(client, "cat /root/drill.sha256 2>/dev/null").stdout.strip()
        time.sleep(5)
    assert digest == expected, remote.run(client, "cat /root/drill.log").stdout
    # After the server came back, the share works for new writes too.
    sh(client, f"runuser -u {user} -- sh -c 'echo after > {share}/drill-after.txt'")
    assert sh(server, f"cat {server.settings.nfs_export_root}/datasets/drill-after.txt").strip() == "after"
    sh(client, f"runuser -u {user} -- rm -f {share}/drill.bin {share}/drill-after.txt")
