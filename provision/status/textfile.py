"""`provision status`'s figures for Prometheus: each reachable host's count of drift from
the pinned settings, written into its textfile directory (the monitoring step's), so a
fleet view shows drift without anyone running status by hand every time."""

from __future__ import annotations

from provision.inventory import Cluster
from provision.rules import monitoring as layout
from provision.status.judge import HostStatus
from provision.validate.textfile import write_each

FILE = f"{layout.TEXTFILE_DIR}/provision_status.prom"


def exposition(status: HostStatus, at: float) -> str:
    return (
        "# HELP provision_drift_items Items that differ from the pinned settings at the last provision status.\n"
        "# TYPE provision_drift_items gauge\n"
        f"provision_drift_items {len(status.drift)}\n"
        "# HELP provision_status_timestamp_seconds When provision status last read this node.\n"
        "# TYPE provision_status_timestamp_seconds gauge\n"
        f"provision_status_timestamp_seconds {int(at)}\n"
    )


def publish(cluster: Cluster, statuses: list[HostStatus], at: float) -> dict[str, str]:
    """host -> why not, where a reachable host could not take its figures."""
    return write_each(cluster, FILE, {s.name: exposition(s, at) for s in statuses if s.reachable})
