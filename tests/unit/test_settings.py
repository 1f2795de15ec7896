"""The settings model: every knob documented, every default valid, pyinfra keys untouched."""

from __future__ import annotations

import pytest

from provision.settings import Settings, is_pyinfra_key, knob_docs, parse_settings


def test_every_knob_has_a_one_line_comment():
    for name, _default, doc in knob_docs():
        assert doc.strip() and "\n" not in doc, name


def test_every_default_passes_its_own_validation():
    defaults = {name: default for name, default, _ in knob_docs()}
    settings, problems = parse_settings(defaults, "defaults")
    assert problems == []
    assert settings == Settings()


def test_list_defaults_are_not_shared_between_hosts():
    a, b = Settings(), Settings()
    assert a.nfs_exports == b.nfs_exports and a.nfs_exports is not b.nfs_exports


@pytest.mark.parametrize("key", ["ssh_hostname", "ssh_port", "_sudo", "_env"])
def test_pyinfra_connection_keys_and_global_arguments_pass_through(key):
    assert is_pyinfra_key(key)
    assert parse_settings({key: object()}, "x")[1] == []


def test_int_setting_refuses_bool_and_float_setting_takes_int():
    _, problems = parse_settings({"apt_lock_wait_s": True}, "x")
    assert len(problems) == 1 and "apt_lock_wait_s" in str(problems[0])


def test_data_disks_accepts_auto_by_id_and_serial():
    for value in ("auto", ["/dev/disk/by-id/nvme-X_1"], ["S6EXAMPLE0001"]):
        assert parse_settings({"data_disks": value}, "x")[1] == []
