"""The running job for Prometheus: rank 0's latest step, train loss and tokens/s, written
every LIVE_EVERY_S into the textfile directory of the node rank 0 runs on (the monitoring
step's node exporter serves it; `provision monitor` and the training dashboard read it).

The figures are parsed here, on the controller, from rank 0's log lines (logs.Curves), and
written by root over the run's own SSH connection: the training user, who owns the
trainer's output, never writes the file and nothing it prints reaches it but numbers. The
file is removed when the run ends; a file left by a run killed with the controller carries
its last update time, and the monitor and dashboards drop figures older than
rules.monitoring.TRAIN_FRESH_S."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Collection
from shlex import quote
from typing import Any

from provision import remote
from provision.launch import logs
from provision.rules import monitoring as layout

WRITE_S = 15  # one write's deadline; a late one waits for the next round
# A file no run has rewritten for this long was left by a controller killed mid-run (a live
# run rewrites its file every LIVE_EVERY_S): removed when a run first writes on the host.
STALE_MIN = 60
_RUN_ID = re.compile(r"[A-Za-z0-9._-]{1,80}")


def path_for(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"not a run id for a file name: {run_id!r}")
    return f"{layout.TEXTFILE_DIR}/provision_train_{run_id}.prom"


def exposition(run_id: str, step: int, loss: float, tokens_per_second: float | None, at: float) -> str:
    run = f'run="{layout.label_value(run_id)}"'
    rows = [
        ("provision_train_step", "The running job's last logged step (rank 0).", float(step)),
        ("provision_train_loss", "Its train loss at that step.", loss),
        ("provision_train_tokens_per_second", "Its tokens/s, all ranks, at that step.", tokens_per_second),
        ("provision_train_updated_timestamp_seconds", "When provision last wrote these figures.", float(int(at))),
    ]
    lines = []
    for name, doc, value in rows:
        if value is not None and math.isfinite(value):
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{run}}} {value!r}"]
    return "\n".join(lines) + "\n"


def _as_root(conn: Any, command: str) -> str:
    """The textfile directory is root's: through sudo unless the run's SSH user is root."""
    return remote.as_root(getattr(conn, "user", "root"), command)


class LiveSeries:
    """Follows rank 0 (``rank0_on``: the host its lines come from, which an elastic run
    may move) and keeps its figures in that host's textfile directory until stop()."""

    def __init__(
        self,
        run_id: str,
        conns: dict[str, Any],
        curves: logs.Curves,
        every_s: float = layout.LIVE_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path_for(run_id)
        self.run_id, self.conns, self.curves = run_id, conns, curves
        self.every_s, self.clock = every_s, clock
        self.rank0_on: str | None = None
        self.written_on: str | None = None  # where the file is now
        self.failed: dict[str, str] = {}  # host -> why its last write failed
        # host -> its clock less the controller's: the figures' update time is the node's,
        # as Prometheus' time() on the head is, not a laptop's that may be minutes off
        self.offsets: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="live-series")

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.publish()

    def publish(self) -> None:
        """Write the latest figures on rank 0's host (and remove the file from the host
        rank 0 left)."""
        host = self.rank0_on
        # The stream threads replace these lists on a restart (logs.Curves.feed): each is
        # read once here, then only the copy is used.
        train, rates = self.curves.train, self.curves.tokens_per_s
        if host is None or not train or host not in self.conns:
            return
        step, loss = train[-1]
        rate = rates[-1][1] if rates and rates[-1][0] == step else None
        if host not in self.offsets:
            self._meet(host)
        at = self.clock() + self.offsets[host]
        write = layout.write_command(self.path, exposition(self.run_id, step, loss, rate, at))
        if self.written_on not in (None, host):
            self._remove(self.written_on)
        done = remote.run_beside(self.conns[host], host, _as_root(self.conns[host], write), WRITE_S)
        if done.ok:
            self.written_on = host
            self.failed.pop(host, None)
        elif done.exited != layout.NOT_MONITORED:
            self.failed[host] = (done.stderr.strip() or f"exit {done.exited}")[:200]

    def _meet(self, host: str) -> None:
        """The first round on a host: read its clock, and remove the files of runs long dead
        there (root's directory: nothing the training user wrote is touched)."""
        prune = (
            f"find {quote(layout.TEXTFILE_DIR)} -maxdepth 1 -type f -name 'provision_train_*.prom' "
            f"! -name {quote(self.path.rsplit('/', 1)[1])} -mmin +{STALE_MIN} -delete 2>/dev/null"
        )
        before = self.clock()
        done = remote.run_beside(
            self.conns[host], host, _as_root(self.conns[host], f"date +%s; {prune}; true"), WRITE_S
        )
        after = self.clock()
        first = done.stdout.split()[0] if done.ok and done.stdout.split() else ""
        # Unread (sudo refused, past the deadline): the controller's clock for this run,
        # not another round trip every round.
        self.offsets[host] = int(first) + 0.5 - (before + after) / 2 if first.isdigit() else 0.0

    def _remove(self, host: str) -> None:
        if host in self.conns:
            remote.run_beside(self.conns[host], host, _as_root(self.conns[host], f"rm -f {quote(self.path)}"), WRITE_S)
        self.written_on = None

    def halt(self) -> None:
        """No new write from here on (one in flight ends within its deadline)."""
        self._stop.set()

    def stop(self, unreachable: Collection[str] = ()) -> None:
        """End the loop and remove the file, unless its host is gone (its figures then go
        stale and drop out of the views by their update time)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=WRITE_S + 5)
        if self.written_on is not None and self.written_on not in unreachable:
            self._remove(self.written_on)
