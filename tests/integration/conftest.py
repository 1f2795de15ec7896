"""Integration fixtures: hosts in network namespaces, each with its own sshd.

``netns_hosts`` is a factory: ``netns_hosts(n)`` returns a ``tests.helpers.netns.NetnsCluster``
of n hosts (ns0, ns1, ...) on a private 10.231.X.0/24 that only exists on a bridge this
fixture creates, each reached over real SSH with strict host-key checking, with a
pyinfra inventory at ``cluster.inventory`` (group ``nodes``; every host has
``cluster_address`` set to its namespace address). Extra host data for every host:

    def test_something(netns_hosts):
        cluster = netns_hosts(3, venv_path="/work/main/.venv")
        run(["provision", "train", str(cluster.inventory)])
        cluster.exec(cluster.hosts[0], "ip", "-br", "addr")   # run inside a namespace

Clusters are shared by the tests of one module (scope="module") and torn down when it
ends: every sshd stopped by pid, namespaces, veths and the bridge deleted, and that
checked. Needs root; tests using it are skipped without root.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import netns


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """PROVISION_STATE_DIR in the test's own tmp_path: generated keys and passwords land there."""
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture(scope="module")
def netns_hosts(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("network-namespace hosts need root")
    clusters: list[netns.NetnsCluster] = []

    def make(n: int, **extra_host_data: object) -> netns.NetnsCluster:
        cluster = netns.start(n, tmp_path_factory.mktemp("netns"), extra_host_data)
        clusters.append(cluster)
        return cluster

    yield make
    left = []
    for cluster in clusters:
        cluster.stop()
        left += cluster.leftovers()
    assert not left, f"netns teardown left {left}"
