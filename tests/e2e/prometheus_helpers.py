"""Prometheus' HTTP API on the testbed's head, asked from the head itself (it listens on
the head's cluster address only), for the e2e tests that check what reached it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from shlex import quote
from typing import Any
from urllib.parse import quote as url_quote

from provision.rules import monitoring
from tests.e2e.storage_helpers import sh

SCRAPE_WAIT_S = 120  # a restored snapshot's Prometheus needs a scrape or two after boot


def api(head, path: str) -> Any:
    """GET Prometheus' HTTP API on the head, from the head itself (its cluster address)."""
    url = f"http://{monitoring.host_port(head.cluster_address, monitoring.PROMETHEUS_PORT)}{path}"
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=20).read().decode())"
    return json.loads(sh(head, f"python3 -c {quote(code)}", timeout_s=60))


def query(head, expr: str) -> list[dict[str, Any]]:
    return api(head, f"/api/v1/query?query={url_quote(expr)}")["data"]["result"]


def wait_for(head, expr: str, count: int) -> list[dict[str, Any]]:
    """The query's series once there are ``count`` of them (scrapes take a while)."""
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while True:
        result = query(head, expr)
        if len(result) >= count or time.monotonic() > deadline:
            return result
        time.sleep(5)


def wait_until(head, expr: str, ok: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The query's series once ``ok`` holds for them (a rewritten file is seen at the next
    scrape), or the last answer after SCRAPE_WAIT_S for the test to show."""
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while True:
        result = query(head, expr)
        if ok(result) or time.monotonic() > deadline:
            return result
        time.sleep(5)
