"""The TensorBoard copy's unpacking on the controller: only regular event files, by name,
within the limits, whatever the archive from the node holds."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

from provision.launch import events


def _archive(members: list[tuple[str, bytes, bytes]]) -> str:
    """(name, type, data) -> the base64 tar.gz the node's copy command prints."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            if kind == tarfile.SYMTYPE:
                info.linkname = "/etc/shadow"
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
    return base64.b64encode(out.getvalue()).decode()


def test_only_regular_event_files_are_unpacked_by_name(tmp_path: Path) -> None:
    encoded = _archive(
        [
            ("./events.out.tfevents.1.node1", tarfile.REGTYPE, b"events"),
            ("./hparams/events.out.tfevents.2.node1", tarfile.REGTYPE, b"hp"),
            ("./events.out.tfevents.3.link", tarfile.SYMTYPE, b""),
            ("../../etc/cron.d/events.out.tfevents.x", tarfile.REGTYPE, b"evil"),
            ("./notes.txt", tarfile.REGTYPE, b"not an event file"),
        ]
    )
    written, note = events.unpack(encoded, tmp_path)
    assert note is None
    assert sorted(written) == ["events.out.tfevents.1.node1", "hparams/events.out.tfevents.2.node1"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(written)


def test_the_file_count_and_total_size_hold_here_too(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(events, "MAX_FILES", 2)
    encoded = _archive([(f"./events.out.tfevents.{k}.n", tarfile.REGTYPE, b"x") for k in range(5)])
    written, note = events.unpack(encoded, tmp_path)
    assert len(written) == 2
    assert note is not None
    assert "stop at 2" in note


def test_a_cut_or_foreign_copy_keeps_what_came_and_says_so(tmp_path: Path) -> None:
    assert events.unpack("not base64!", tmp_path) == ([], "the copy was not base64")
    whole = base64.b64decode(_archive([("./events.out.tfevents.1.n", tarfile.REGTYPE, b"e" * 100_000)]))
    _, note = events.unpack(base64.b64encode(whole[: len(whole) // 2]).decode(), tmp_path / "cut")
    assert note is not None
    assert "ended early" in note
