"""Bad inventories stop every command before any host: a loopback listener counts the connections."""

from __future__ import annotations

import pytest

from tests.unit.test_inventory import ConnectionCounter, write


@pytest.mark.parametrize(
    "bad",
    [
        "{'bogus_key': 1}",
        "{'ssh_key': '/nonexistent/key'}",
        "{'raid_level': 'zero'}",
    ],
)
def test_bad_input_exits_2_with_one_line_and_contacts_no_host(tmp_path, cli, bad):
    listeners = [ConnectionCounter(), ConnectionCounter()]
    try:
        good = {"ssh_hostname": "127.0.0.1", "ssh_port": listeners[0].port, "cluster_address": "10.9.0.1"}
        inv = write(
            tmp_path / "inv.py",
            f"nodes = [('good', {good!r}), ('bad', dict({{'ssh_hostname': '127.0.0.1', "
            f"'ssh_port': {listeners[1].port}, 'cluster_address': '10.9.0.2'}}, **{bad}))]\n",
        )
        result = cli("facts", str(inv))
    finally:
        for listener in listeners:
            listener.close()
    assert result.code == 2
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert "host bad" in lines[0]
    assert "Traceback" not in result.err
    assert [listener.count for listener in listeners] == [0, 0]
