"""The workdir packed for the nodes and outputs unpacked here (jobs/bundle.py)."""

from __future__ import annotations

import io
import tarfile

import pytest

from provision.errors import InputError
from provision.jobs import bundle


def _tree(tmp_path):
    src = tmp_path / "src"
    (src / ".git").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("ref\n")
    (src / "pkg").mkdir()
    (src / "pkg" / "model.py").write_text("x = 1\n")
    (src / "train.py").write_text("print(1)\n")
    return src


def test_git_and_caches_are_left_out_and_named_unless_included(tmp_path):
    src = _tree(tmp_path)
    packed = bundle.pack(src, tmp_path / "w.tar.gz")
    with tarfile.open(packed.path) as tar:
        assert sorted(tar.getnames()) == ["pkg/model.py", "train.py"]
    assert packed.left_out == [".git/ (left out by default)"]
    with_git = bundle.pack(src, tmp_path / "g.tar.gz", include=(".git",))
    with tarfile.open(with_git.path) as tar:
        assert ".git/HEAD" in tar.getnames()


def test_a_file_over_the_bound_is_left_out_and_a_tree_over_its_bound_is_bad_input(tmp_path, monkeypatch):
    src = _tree(tmp_path)
    monkeypatch.setattr(bundle, "FILE_MAX_BYTES", 5)
    packed = bundle.pack(src, tmp_path / "w.tar.gz")
    assert any(left.startswith("pkg/model.py") for left in packed.left_out)
    monkeypatch.setattr(bundle, "FILE_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(bundle, "WORKDIR_MAX_BYTES", 10)
    with pytest.raises(InputError, match="MiB to sync"):
        bundle.pack(src, tmp_path / "x.tar.gz")


def _archive(tmp_path, member: tarfile.TarInfo, data: bytes = b"") -> object:
    path = tmp_path / "out.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return path


def test_outputs_from_a_node_never_write_outside_their_directory(tmp_path):
    dest = tmp_path / "dest"
    evil = tarfile.TarInfo("../escaped.txt")
    evil.size = 2
    with pytest.raises(tarfile.FilterError):
        bundle.unpack(_archive(tmp_path, evil, b"hi"), dest)
    assert not (tmp_path / "escaped.txt").exists()
    link = tarfile.TarInfo("passwd")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    with pytest.raises(tarfile.FilterError):
        bundle.unpack(_archive(tmp_path, link), dest)


def test_outputs_unpack_with_their_files(tmp_path):
    model = tarfile.TarInfo("model.pt")
    model.size = 3
    assert bundle.unpack(_archive(tmp_path, model, b"abc"), tmp_path / "d") == 1
    assert (tmp_path / "d" / "model.pt").read_bytes() == b"abc"
