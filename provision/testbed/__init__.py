"""The local VM testbed: real Debian 12 VMs under qemu, for tests and `provision demo`.

One module per concept:

- ``paths``: where the image cache and the testbed state live (XDG cache dir).
- ``tools``: the host programs the testbed needs, checked up front.
- ``apt_sources``: the machine's own apt mirror (deb822 and one-line), parsed as text.
- ``image``: the debootstrapped base image, built once per recipe and cached.
- ``keys``: the controller-side SSH key pair and per-node host keys, known_hosts.
- ``seed``: the small per-node disk that hands a node its keys and network config.
- ``qemu``: the qemu command line for a node (pure), QMP for live changes.
- ``network``: loopback port allocation and the private vde cluster switch.
- ``accel``: KVM-or-TCG, decided by a probe VM that must really boot.
- ``procs``: processes by pid (alive, ours, stop), never by name.
- ``state``: the state file recording every process and file the testbed made.
- ``inventory_writer``: the pyinfra inventory for the running testbed.
- ``lifecycle``: ``Testbed``, which ties them together (up, down, status, stop/start).
"""

from typing import Any

__all__ = ["NodeRecord", "Testbed"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so `provision --help` does not load the whole testbed.
    if name == "Testbed":
        from provision.testbed.lifecycle import Testbed

        return Testbed
    if name == "NodeRecord":
        from provision.testbed.state import NodeRecord

        return NodeRecord
    raise AttributeError(name)
