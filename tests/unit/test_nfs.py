"""The nfs step: exports only to the cluster network, client mount options, templates,
and the deploy's exact commands on pyinfra's @fake connector."""

from __future__ import annotations

import re

from provision.deploys import nfs
from provision.operations import stamps
from provision.settings import Settings
from tests.helpers.pyinfra_fake import fake_node, run_fake


def settings(**kw: object) -> Settings:
    return Settings(**{"cluster_cidr": "10.77.0.0/24", **kw})  # type: ignore[arg-type]


def test_exports_go_to_the_cluster_cidr_only_never_everyone():
    text = nfs.exports_text(settings())
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "/data/shared/datasets 10.77.0.0/24(rw,sync,root_squash,no_subtree_check)",
        "/data/shared/checkpoints 10.77.0.0/24(rw,sync,root_squash,no_subtree_check)",
        "/data/shared/scratch 10.77.0.0/24(rw,sync,root_squash,no_subtree_check)",
    ]
    assert "*" not in text


def test_exports_name_the_network_not_a_host_address_inside_it():
    assert "10.77.0.0/24(" in nfs.exports_text(settings(cluster_cidr="10.77.0.5/24"))


def test_no_cluster_cidr_is_refused_rather_than_exported_to_everyone():
    (problem,) = nfs.export_problems(Settings(), "node1")
    assert problem.startswith("node1: cluster_cidr is not set")
    (problem,) = nfs.export_problems(settings(cluster_cidr="0.0.0.0/0"), "node1")
    assert "means every address" in problem
    assert nfs.export_problems(settings(), "node1") == []


def test_a_client_mounts_the_path_the_server_exports_whatever_its_own_data_mount():
    # The server keeps its data on /data (exports under /data/shared); a client's data
    # volume is at /scratch, which moves only its own (unused) export root.
    client = Settings(data_mount="/scratch", nfs_export_root="/scratch/shared", nfs_mount_root="/mnt/shares")
    line = nfs.client_fstab_line("10.77.0.1", settings(), client, "datasets")
    assert line.split()[:2] == ["10.77.0.1:/data/shared/datasets", "/mnt/shares/datasets"]


def test_client_mounts_nfs_4_2_hard_nosuid_nodev_and_never_blocks_boot():
    line = nfs.client_fstab_line("10.77.0.1", settings(), settings(), "checkpoints")
    device, path, fstype, options, dump, passno = line.split()
    assert (device, path, fstype, dump, passno) == (
        "10.77.0.1:/data/shared/checkpoints",
        "/shared/checkpoints",
        "nfs",
        "0",
        "0",
    )
    opts = options.split(",")
    for wanted in (
        "vers=4.2",
        "hard",
        "nosuid",
        "nodev",
        "lookupcache=positive",
        "_netdev",
        "nofail",
        "x-systemd.automount",
    ):
        assert wanted in opts
    assert "soft" not in opts


def test_server_sees_the_shares_at_the_same_paths_through_a_bind_mount():
    assert nfs.bind_fstab_line(settings()) == "/data/shared /shared none bind,nofail 0 0"


def test_nfsd_dropin_waits_for_the_export_root_mount():
    from provision.resources import render_template

    text = render_template("nfs/nfs-server.conf.j2", export_root="/data/shared")
    assert "[Unit]\nRequiresMountsFor=/data/shared\n" in text


def _nodes(**kw: object):
    server = fake_node("node1", settings(**kw), {}, groups=("storage",), address="10.77.0.1")
    client = fake_node("node2", settings(**kw), {}, address="10.77.0.2")
    server = _with_cluster_address(server, "10.77.0.1")
    client = _with_cluster_address(client, "10.77.0.2")
    return server, client


def _with_cluster_address(node, address):
    from dataclasses import replace

    return replace(node, settings=replace(node.settings, cluster_address=address))


def test_server_exports_and_client_automounts_over_cluster_addresses(monkeypatch):
    server, client = _nodes()
    run = run_fake(nfs.step, [server, client], monkeypatch)
    s, c = server.name, client.name
    assert run.results[s].ok, (run.results[s].failures, run.results[c].failures)
    assert run.results[c].ok, (run.results[s].failures, run.results[c].failures)
    assert run.ran(s, "apt-get .*install.*nfs-kernel-server")
    assert run.ran(s, r"mkdir -p /data/shared/checkpoints")
    assert run.ran(s, r"chown train:train /data/shared/checkpoints")
    # The account this step makes on a fresh host has base's pinned ids (NFS maps by number).
    for h in (s, c):
        assert run.ran(h, r"groupadd train --gid 2000")
        assert run.ran(h, r"useradd .*--uid 2000 .*train")
    assert run.ran(s, r"systemctl start nfs-server.service")
    assert run.ran(s, r"^exportfs -ra$")
    assert run.ran(s, re.escape("echo '/data/shared /shared none bind,nofail 0 0' >> /etc/fstab"))
    assert run.ran(s, r"^mount /shared$")
    assert not run.ran(s, r"nfs-common|automount")
    line = nfs.client_fstab_line("10.77.0.1", settings(), settings(), "datasets")
    assert run.ran(c, re.escape(f"echo '{line}' >> /etc/fstab"))
    assert run.ran(c, r"systemctl daemon-reload")
    assert run.ran(c, r"systemctl start shared-datasets\.automount")
    assert not run.ran(c, r"nfs-kernel-server|exportfs")


def test_server_without_cluster_cidr_is_refused_and_exports_nothing(monkeypatch):
    server, client = _nodes(cluster_cidr=None)
    run = run_fake(nfs.step, [server, client], monkeypatch)
    assert not run.results[server.name].ok
    (refusal,) = run.ran(server.name, "exit 1$")
    assert "cluster_cidr is not set" in refusal
    assert not run.ran(server.name, "exportfs|/etc/exports|apt-get")


# Follow-ups after an interrupted `up`: the files are right, only the stamp tells whether
# exportfs -ra / the daemon-reload ran for them (operations/stamps.py).


def _client_with_fstab_in_place(stamp: str | None):
    s = settings()
    lines = [nfs.client_fstab_line("10.77.0.1", s, s, share) for share in s.nfs_exports]
    answers: dict = {
        re.compile(rf"grep -E -e .*\]\+{re.escape(path)}\[.* /etc/fstab"): [line]
        for path, line in zip(nfs.mount_paths(s), lines, strict=True)
    }
    answers |= {re.compile(rf"grep -E -e '\^{re.escape(line)}\$' /etc/fstab"): [line] for line in lines}
    answers[re.compile("cat /var/lib/provision/stamps/nfs-client-fstab")] = [stamp] if stamp else []
    client = _with_cluster_address(fake_node("node2", s, answers, address="10.77.0.2"), "10.77.0.2")
    server = _with_cluster_address(fake_node("node1", s, {}, groups=("storage",), address="10.77.0.1"), "10.77.0.1")
    return server, client, stamps.digest(lines)


def test_client_reloads_systemd_when_fstab_is_right_but_its_stamp_is_missing(monkeypatch):
    # An `up` killed after writing fstab and before the reload: without it the automount
    # units do not exist, and starting them fails in this run and every later one.
    server, client, want = _client_with_fstab_in_place(None)
    run = run_fake(nfs.step, [server, client], monkeypatch)
    assert not run.ran(client.name, ">> /etc/fstab|sed -i.*/etc/fstab"), "fstab is already right"
    assert run.ran(client.name, "^systemctl daemon-reload$")
    assert run.ran(client.name, re.escape(stamps.stamp_command("nfs-client-fstab", want)))


def test_client_with_fstab_and_stamp_current_does_not_reload(monkeypatch):
    _, _, want = _client_with_fstab_in_place(None)
    server, client, _ = _client_with_fstab_in_place(want)
    run = run_fake(nfs.step, [server, client], monkeypatch)
    assert not run.ran(client.name, "daemon-reload|stamps/nfs-client-fstab.tmp")


def _server_with_exports_in_place(stamp: str | None):
    import hashlib

    s = settings()
    text = nfs.exports_text(s)
    answers: dict = {
        re.compile(r"stat -c .* /etc/exports\.d/provision\.exports"): [
            "user=root group=root mode=-rw-r--r-- atime=0 mtime=0 ctime=0 size=1 '/etc/exports.d/provision.exports'"
        ],
        re.compile(r"test -e /etc/exports\.d \|\|"): [
            "user=root group=root mode=drwxr-xr-x atime=0 mtime=0 ctime=0 size=4096 '/etc/exports.d'"
        ],
        re.compile(r"sha1sum /etc/exports\.d/provision\.exports"): [
            f"{hashlib.sha1(text.encode()).hexdigest()}  /etc/exports.d/provision.exports"
        ],
        re.compile("cat /var/lib/provision/stamps/nfs-exports"): [stamp] if stamp else [],
    }
    server = _with_cluster_address(
        fake_node("node1", s, answers, groups=("storage",), address="10.77.0.1"), "10.77.0.1"
    )
    return server, stamps.digest([text])


def test_server_re_exports_when_the_exports_file_is_right_but_its_stamp_is_stale(monkeypatch):
    server, want = _server_with_exports_in_place("digest of an older exports file")
    run = run_fake(nfs.step, [server], monkeypatch)
    assert not run.ran(server.name, r"mkdir -p /etc/exports\.d"), "the file and its directory are already right"
    assert run.ran(server.name, "^exportfs -ra$")
    assert run.ran(server.name, re.escape(stamps.stamp_command("nfs-exports", want)))


def test_server_with_exports_and_stamp_current_does_not_re_export(monkeypatch):
    _, want = _server_with_exports_in_place(None)
    server, _ = _server_with_exports_in_place(want)
    run = run_fake(nfs.step, [server], monkeypatch)
    assert not run.ran(server.name, "exportfs")
