"""An all-reduce rank that hangs as a rank stuck in NCCL would: it never reports, and it
ignores SIGTERM. Importable by the spawned rank processes of validate's agent."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def hung_rank(rank: int, world: int, port: int, mb: int, seconds: float, queue: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pid_dir = os.environ["HUNG_RANK_PIDS"]
    with open(os.path.join(pid_dir, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)
