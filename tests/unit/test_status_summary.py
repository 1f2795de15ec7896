"""`provision status` at fleet scale: the summary's counts and versions, and the exceptions
it names, on status records built here (no host, no SSH)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from provision.cli import status as status_cli
from provision.status.judge import Drift, HostStatus
from provision.status.summary import (
    EVERY_HOST_UP_TO,
    Shared,
    as_json,
    exceptions,
    host_ranges,
    lists_every_host,
    seen_text,
    summarize,
)

VERSIONS = {
    "driver": "580.95.05",
    "cuda": "12-8",
    "fabricmanager": "580.95.05",
    "torch": "2.13.0+cu128",
    "nccl": "2.27.3",
    "numpy": "2.2.6",
}
MOUNTS_OK = {"/data": "ok", "/shared/datasets": "ok"}


def host(i: int, **changes) -> HostStatus:
    fields = {
        "os": "Ubuntu 24.04.3 LTS",
        "kernel": "6.8.0-85-generic",
        "versions": dict(VERSIONS),
        "mounts": dict(MOUNTS_OK),
        **changes,
    }
    return HostStatus(f"node-{i:04d}", True, **fields)


def fleet_of_1000() -> list[HostStatus]:
    """998 matching hosts, one drifted (an old driver, a reboot pending, a dead share), one unreachable."""
    hosts = [host(i) for i in range(1000)]
    hosts[417] = host(
        417,
        versions={**VERSIONS, "driver": "570.172.08"},
        reboot_pending=True,
        mounts={"/data": "ok", "/shared/datasets": "not answering"},
        drift=[
            Drift("nvidia driver", "580.*", "570.172.08"),
            Drift("mount /shared/datasets", "mounted and answering", "not answering"),
        ],
    )
    hosts[803] = HostStatus("node-0803", False, error="Connection refused")
    return hosts


def test_a_thousand_hosts_are_summed_up_in_counts():
    summary = summarize(fleet_of_1000())
    assert (summary.hosts, summary.reachable, summary.unreachable) == (1000, 999, 1)
    assert (summary.drifted, summary.reboot_pending, summary.mounts_not_ok) == (1, 1, 1)


def test_the_versions_seen_are_counted_most_hosts_first():
    seen = summarize(fleet_of_1000()).seen
    assert seen["driver"] == [("580.95.05", 998), ("570.172.08", 1)]  # the unreachable host is not counted
    assert seen["torch"] == [("2.13.0+cu128", 999)]
    assert seen["os"] == [("Ubuntu 24.04.3 LTS", 999)]
    assert seen_text(seen["driver"]) == "580.95.05 x998, 570.172.08 x1"


def test_a_host_without_an_item_is_counted_as_none():
    hosts = [host(0), host(1, versions={**VERSIONS, "fabricmanager": None})]
    assert summarize(hosts).seen["fabricmanager"] == [("-", 1), ("580.95.05", 1)]


def test_many_values_of_one_item_are_named_up_to_a_few_and_the_rest_summed():
    values = [(f"6.8.0-{n}", 10 - n) for n in range(8)]
    assert seen_text(values, named=2) == "6.8.0-0 x10, 6.8.0-1 x9, + 6 more values on 33 hosts"


def test_a_drifted_host_among_a_thousand_is_listed_with_expected_and_actual():
    found = exceptions(fleet_of_1000())
    assert found.drift == [Shared(("nvidia driver", "580.*", "570.172.08"), ["node-0417"])]
    assert found.reboot_pending == ["node-0417"]
    assert found.mounts == [Shared(("/shared/datasets", "not answering"), ["node-0417"])]
    assert found.unreachable == [Shared(("Connection refused",), ["node-0803"])]
    assert summarize(fleet_of_1000()).healthy == 998


def test_an_exception_many_hosts_share_is_one_entry_with_every_host():
    hosts = [host(i, drift=[Drift("torch", "2.13.0", "not installed")]) for i in range(1000)]
    hosts[5] = HostStatus("node-0005", False, error="timed out in fact os after 2 s")
    hosts[9] = HostStatus("node-0009", False, error="timed out in fact os after 2 s")
    found = exceptions(hosts)
    (torch,) = found.drift
    assert torch.key == ("torch", "2.13.0", "not installed")
    assert len(torch.hosts) == 998
    assert host_ranges(torch.hosts) == "node-[0000-0004], node-[0006-0008], node-[0010-0999]"
    assert found.unreachable == [Shared(("timed out in fact os after 2 s",), ["node-0005", "node-0009"])]


def test_host_ranges_join_consecutive_numbers_and_keep_other_names():
    assert host_ranges(["gpu1", "gpu2", "gpu3", "storage", "gpu9", "gpu10", "n09", "n010"]) == (
        "gpu[1-3], storage, gpu[9-10], n09, n010"
    )
    assert host_ranges(["a7"]) == "a7"
    assert host_ranges([]) == ""


def test_a_mount_problem_is_listed_under_mounts_and_not_again_as_drift():
    storage = host(
        0,
        mounts={"nfs-server": "failed"},
        drift=[Drift("nfs-server", "active", "failed"), Drift("numpy", "2.2.6", "1")],
    )
    found = exceptions([storage])
    assert [s.key[0] for s in found.drift] == ["numpy"]
    assert found.mounts == [Shared(("nfs-server", "failed"), ["node-0000"])]


def test_every_host_row_up_to_the_threshold_or_when_asked():
    assert lists_every_host(EVERY_HOST_UP_TO, every=False)
    assert not lists_every_host(EVERY_HOST_UP_TO + 1, every=False)
    assert lists_every_host(1000, every=True)


def test_json_keeps_its_keys_and_adds_the_summary():
    report = json.loads(json.dumps(as_json(fleet_of_1000())))
    assert report["schema"] == "provision.status.judge/1"
    assert report["ok"] is False
    assert len(report["hosts"]) == 1000
    assert report["hosts"][417]["drift"][0] == {"item": "nvidia driver", "expected": "580.*", "actual": "570.172.08"}
    summary = report["summary"]
    assert (summary["hosts"], summary["unreachable"], summary["drifted"], summary["mounts_not_ok"]) == (1000, 1, 1, 1)
    assert summary["seen"]["driver"] == [{"value": "580.95.05", "hosts": 998}, {"value": "570.172.08", "hosts": 1}]
    assert as_json([host(0), host(1)])["ok"] is True


def printed(monkeypatch, statuses, every=False) -> str:
    buffer = io.StringIO()
    monkeypatch.setattr(status_cli, "out", Console(file=buffer, width=200, highlight=False, color_system=None))
    status_cli.print_status(statuses, every)
    return buffer.getvalue()


def test_a_thousand_hosts_print_the_summary_and_the_exceptions_not_a_row_each(monkeypatch):
    text = printed(monkeypatch, fleet_of_1000())
    assert "1000 hosts, 999 reachable, 1 unreachable, 1 drifted, 1 reboot pending, 1 mounts not ok" in text
    assert "580.95.05 x998, 570.172.08 x1" in text
    assert "node-0803" in text
    assert "Connection refused" in text
    assert "nvidia driver" in text
    assert "570.172.08" in text
    assert "580.*" in text
    assert "reboot pending: node-0417" in text
    assert "998 healthy hosts not listed" in text
    assert "node-0001" not in text  # a healthy host
    assert len(text.splitlines()) < 60


def test_all_prints_every_host_row(monkeypatch):
    text = printed(monkeypatch, fleet_of_1000(), every=True)
    assert all(f"node-{i:04d}" in text for i in range(1000))


def test_a_small_fleet_prints_every_host_row_after_the_summary(monkeypatch):
    text = printed(monkeypatch, [host(0), host(1)])
    assert text.index("2 hosts, 2 reachable") < text.index("node-0000") < text.index("node-0001")
    assert "no drift" in text


def test_no_drift_is_never_said_of_hosts_that_did_not_answer(monkeypatch):
    # Every host unreachable printed "no drift: every host matches its pinned settings".
    down = [HostStatus(f"node-{i:04d}", False, error="Connection refused") for i in range(2)]
    text = printed(monkeypatch, down)
    assert "no host answered: drift unknown" in text
    assert "no drift" not in text
    text = printed(monkeypatch, [host(0), down[1]])
    assert "no drift on the 1 reachable hosts; 1 unreachable, unknown" in text


HOSTILE = "[/x] [bold]not bold[/bold] \x1b]0;retitled\x07"


def test_host_text_in_the_summary_and_the_exceptions_is_printed_as_text(monkeypatch):
    hosts = [host(i, kernel=f"6.8 {HOSTILE}") for i in range(EVERY_HOST_UP_TO + 1)]
    hosts[0] = HostStatus("node-0000", False, error=f"refused {HOSTILE}")
    hosts[1] = host(1, drift=[Drift("torch", "2.13.0", f"2.12 {HOSTILE}")])
    text = printed(monkeypatch, hosts)
    assert text.count("[/x] [bold]not bold[/bold]") >= 3  # kernel seen, unreachable's why, drift's actual
    assert "\x1b" not in text
