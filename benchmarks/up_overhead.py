"""`provision up` wall time / the same apt + pip work typed by hand over one SSH session,
each on its own fresh node (target <= 1.3): what pyinfra, facts and checks cost on top
of the package installs themselves.

Run: .venv/bin/python benchmarks/up_overhead.py
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from up_common import FreshTestbed, verdict

from provision import inventory
from provision.rules.frameworks import REMOTE_WHEELHOUSE
from provision.rules.packages import BASE_PACKAGES


def by_hand(tb: FreshTestbed) -> float:
    """The same work as a person would type it: scp the wheels, then apt and pip over ssh.
    (OpenSSH's own clients, not fabric: this process has pyinfra's gevent patching, under
    which a fabric SFTP upload hung here.)"""
    node = inventory.load(tb.tb.inventory_path).nodes[0]
    ssh = node.ssh
    opts = ["-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={ssh.known_hosts}", "-i", str(ssh.key)]
    target = f"{ssh.user}@{ssh.hostname}"

    def remote(command: str) -> None:
        subprocess.run(
            ["ssh", *opts, "-p", str(ssh.port), target, command], check=True, stdout=subprocess.DEVNULL, timeout=3600
        )

    wheels = sorted(str(w) for w in Path(str(node.settings.wheelhouse)).glob("*.whl"))
    start = time.monotonic()
    remote(f"mkdir -p {REMOTE_WHEELHOUSE}")
    subprocess.run(
        ["scp", "-q", *opts, "-P", str(ssh.port), *wheels, f"{target}:{REMOTE_WHEELHOUSE}/"], check=True, timeout=3600
    )
    remote(
        "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        + " ".join(BASE_PACKAGES)
    )
    remote(
        f"python3 -m venv /opt/provision/venv && /opt/provision/venv/bin/pip install -q --no-index "
        f"--find-links {REMOTE_WHEELHOUSE} torch==2.13.0 numpy nvidia-ml-py"
    )
    return time.monotonic() - start


def main() -> int:
    with FreshTestbed(nodes=1) as tb:
        manual = by_hand(tb)
    with FreshTestbed(nodes=1) as tb:
        tool, report = tb.up()
    if report.exit_code:
        print(f"up failed: {report.as_json()}")
        return 1
    return verdict("up / by hand", tool / manual, 1.3, f"by hand {manual:.0f}s, up {tool:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
