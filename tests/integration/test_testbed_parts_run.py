"""Testbed parts run for real: the seed script, processes stopped by pid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision.testbed import guest_files, procs


def test_seed_tree_carries_identity_with_guest_modes(tmp_path: Path) -> None:
    from provision.testbed import keys, seed

    host_key = keys.generate(tmp_path / "ssh_host_ed25519_key", "root@node1")
    seed.write_tree(
        tmp_path / "seed", host_key, "ssh-ed25519 AAAA test", {"20-eth1.network": "x"}, "127.0.0.1 localhost\n"
    )
    tree = tmp_path / "seed" / "tree"
    assert (tree / "etc/ssh/ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
    assert (tree / "root").stat().st_mode & 0o777 == 0o700
    assert (tree / "root/.ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA test\n"
    assert (tree / "etc/systemd/network/20-eth1.network").read_text() == "x"
    image_file = seed.make_image(tmp_path / "seed", tmp_path / "seed.img")
    assert image_file.stat().st_size == 16 << 20


def test_processes_are_stopped_by_pid_only_when_they_carry_our_marker(tmp_path: Path) -> None:
    marker = f"{tmp_path}/"
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker + "x"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not procs.stop(other.pid, marker)  # not ours: left alone
        assert procs.alive(other.pid)
        assert procs.stop(ours.pid, marker)
        assert not procs.alive(ours.pid)
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_seed_script_finds_its_disk_by_serial_even_without_a_final_newline(tmp_path: Path) -> None:
    for disk, serial in (("vda", ""), ("vdb", "NVME-node1-1"), ("vdc", guest_files.SEED_SERIAL)):
        (tmp_path / disk).mkdir()
        (tmp_path / disk / "serial").write_text(serial)  # sysfs gives no trailing newline
    discovery = guest_files.SEED_SCRIPT.split("mnt=")[0].replace("/sys/block", str(tmp_path))
    done = subprocess.run(["sh", "-c", discovery + 'echo "$dev"'], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "/dev/vdc"


def test_a_port_whose_connections_are_in_time_wait_is_free_and_a_listened_one_is_not() -> None:
    """A VM killed a moment ago leaves its SSH forward's connections in TIME_WAIT (its side
    closed first); qemu binds with SO_REUSEADDR and can listen there again at once, so the
    VM must keep its port (a running `provision train` knows only that one)."""
    import socket
    import time

    from provision.testbed import network

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as qemu's user network does
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert not network.port_free(port)  # something listens
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side first, as when its qemu is killed
    server.close()
    time.sleep(0.2)
    client.close()
    assert network.port_free(port)
