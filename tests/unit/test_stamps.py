"""Stamps: the fact that reads one, and the command that writes one (operations/stamps.py)."""

from __future__ import annotations

from provision.facts.stamps import Stamp, parse_stamp
from provision.operations import stamps


def test_a_stamp_is_its_one_line_and_none_when_missing_or_empty():
    assert parse_stamp(["0f3a9c"]) == "0f3a9c"
    assert parse_stamp([]) is None
    assert parse_stamp([""]) is None


def test_the_stamp_fact_reads_its_file_and_never_fails_when_it_is_missing():
    assert Stamp().command(stamp="nfs-exports") == "cat /var/lib/provision/stamps/nfs-exports 2>/dev/null || true"


def test_the_digest_changes_with_any_input_and_with_their_split():
    assert stamps.digest(["a", "b"]) == stamps.digest(["a", "b"])
    assert stamps.digest(["a", "b"]) != stamps.digest(["a", "c"])
    assert stamps.digest(["ab"]) != stamps.digest(["a", "b"])


def test_a_stamp_is_written_whole_and_its_value_quoted():
    assert stamps.stamp_command("nfs-exports", "it's") == (
        "mkdir -p /var/lib/provision/stamps && printf '%s\\n' 'it'\"'\"'s' "
        "> /var/lib/provision/stamps/nfs-exports.tmp && "
        "mv -f /var/lib/provision/stamps/nfs-exports.tmp /var/lib/provision/stamps/nfs-exports"
    )
