"""Files on the controller an inventory names, read only when each is a regular file of a
sane size: a FIFO would hang the read, /dev/zero fill memory, a directory raise (an audit
of hostile inventories, session 50, found each of these crashing or hanging a check)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provision import controller_files
from provision.rules import backups, frameworks


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.mkdir(), "is not a regular file"),
        (lambda p: os.mkfifo(p), "is not a regular file"),  # opened, a read would wait for a writer
        (lambda p: p.write_bytes(b"x" * 2049), "is over 2 KiB"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "is not UTF-8 text"),
    ],
)
def test_an_odd_file_is_said_in_one_line_and_never_read(tmp_path: Path, make, said) -> None:
    path = tmp_path / "f"
    make(path)
    with pytest.raises(controller_files.Unreadable) as e:
        controller_files.read_small_text(path, 2048)
    assert str(e.value) == f"{path} {said}"


def test_a_device_that_never_ends_is_not_a_regular_file() -> None:
    with pytest.raises(controller_files.Unreadable, match="/dev/zero is not a regular file"):
        controller_files.read_small(Path("/dev/zero"), 4096)


def test_a_wheelhouse_with_odd_files_is_refused_in_words(tmp_path: Path) -> None:
    (tmp_path / "torch-2.13.0-cp311-none-linux_x86_64.whl").mkdir()  # a directory named as a wheel
    (tmp_path / "SHA256SUMS").write_bytes(b"\xff not text\n")
    assert frameworks.sums_problem(str(tmp_path)).startswith(f"{tmp_path}/SHA256SUMS is not UTF-8 text")
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  torch-2.13.0-cp311-none-linux_x86_64.whl\n")
    assert frameworks.sums_problem(str(tmp_path)).endswith(
        "torch-2.13.0-cp311-none-linux_x86_64.whl is not a regular file"
    )


def test_a_backup_password_file_that_is_a_device_is_refused(tmp_path: Path) -> None:
    from provision.inventory import load

    inv = tmp_path / "inv.py"
    inv.write_text(
        "nodes = [('n1', {'ssh_hostname': '192.0.2.1', 'cluster_address': '10.0.0.1', "
        "'backup_password_file': '/dev/zero'})]\n"
    )
    cluster = load(inv)
    problem = backups.password_problem(cluster.nodes[0], cluster)
    assert problem is not None
    assert problem.what == "/dev/zero is not a regular file", problem
