"""Fixtures of the verify suite: the expected state of the host under test."""

from __future__ import annotations

import json
import os
from typing import Any, cast

import pytest


@pytest.fixture(scope="session")
def spec() -> dict[str, Any]:
    with open(os.environ["PROVISION_VERIFY_SPEC"]) as f:
        return cast("dict[str, Any]", json.load(f))


@pytest.fixture
def expected(host: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """This host's entry of the spec: settings, groups, cluster addresses of all nodes."""
    return cast("dict[str, Any]", spec[host.backend.get_hostname()])


@pytest.fixture
def settings(expected: dict[str, Any]) -> dict[str, Any]:
    return cast("dict[str, Any]", expected["settings"])


def nvidia_applies(host: Any, expected: dict[str, Any]) -> bool:
    """Same rule as the nvidia step: skip / force / gpu_nodes / an NVIDIA GPU on lspci."""
    switch = expected["settings"]["nvidia"]
    if switch == "skip":
        return False
    if switch == "force" or "gpu_nodes" in expected["groups"]:
        return True
    return "[10de:" in host.run("lspci -nn 2>/dev/null || true").stdout
