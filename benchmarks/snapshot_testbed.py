"""The e2e tier's provisioned 2-VM testbed, booted from its snapshot for a benchmark: the
snapshot of this tree's `up` (tests/e2e/snapshot.py; an e2e run saves it) is copied into a
temporary state directory, the VMs boot from it provisioned, and they are taken down when
the benchmark's block ends, however it ends. Nothing is provisioned here."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from provision.testbed import Testbed
from tests.e2e import snapshot
from tests.e2e.conftest import NODES, SHAPE, _wait_for_boot


@contextlib.contextmanager
def booted(prefix: str) -> Iterator[tuple[Testbed, Path, Path]]:
    """(testbed, its inventory, a scratch directory) while the provisioned VMs run."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        inv = root / "inventories" / "testbed.py"
        tb = Testbed(root / "state", inventory_path=inv)
        names = [f"node{i}" for i in range(1, NODES + 1)]
        if snapshot.restore(tb, snapshot.key(tb, SHAPE), inv, names) is None:
            raise SystemExit("no provisioned snapshot for this tree: run the e2e tier once (it saves one)")
        try:
            tb.up(nodes=NODES, disks=SHAPE["disks"])
            _wait_for_boot(tb, names)
            yield tb, inv, root
        finally:
            tb.down()
