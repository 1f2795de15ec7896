"""Test harness, not product code: `provision up` through its own CLI, killed with SIGKILL
(a crash, the OOM killer, a lost controller) the moment a named operation is about to start
on any host: the operation before it has finished there, this one has not been sent.

    python -m tests.e2e.up_killed_at STEP OPERATION HOST INVENTORY [up's options...]

HOST is the host whose operation it is (``*``: any). pyinfra gives the operations at one
place in the deploys one name for every host, so the server's "Re-export" and a client's
"automount ..." at the same place are told apart only by the host.

pyinfra tells the run's progress display that an operation starts (engine/collector.py,
"STEP: <deploy> | OPERATION[, other names at the same place]") before it sends the operation's commands, so the process
dies at a point a test can name instead of at a moment it guesses. It prints
``killed at HOST: STEP: OPERATION`` on stderr first. Tests call ``killed_up``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from provision.cli import console


def killed_up(inv: Path, step: str, operation: str, host: str = "*") -> str:
    """`provision up INV --only STEP` killed as OPERATION starts on HOST (any: *); returns
    the host it was killed at. Fails the test when the run was not killed there."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.e2e.up_killed_at", step, operation, host, str(inv), "--only", step],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == -9, f"not killed: exit {done.returncode}\n{done.stderr[-3000:]}"
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("killed at ")]
    return line.removeprefix("killed at ").split(":", 1)[0]


def main() -> None:
    step, operation, on_host, *up_args = sys.argv[1:]
    shown = console.HostProgress.__call__

    def progress(self: console.HostProgress, host: str, text: str) -> None:
        # pyinfra names an operation by every name given at its place in the deploys, across
        # hosts, sorted and joined ("NFS | Re-export, NFS | automount /shared/datasets").
        names = text.removeprefix(f"{step}: ").split(", ") if text.startswith(f"{step}: ") else []
        if on_host in ("*", host) and any(name == operation or name.endswith(f"| {operation}") for name in names):
            sys.stderr.write(f"killed at {host}: {text}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        shown(self, host, text)

    console.HostProgress.__call__ = progress  # type: ignore[method-assign]
    sys.argv = ["provision", "up", *up_args, "--progress", "lines"]
    from provision.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
