"""Pure decisions of the nvidia step: whether it runs on a host, which driver from where, whether
fabric manager is wanted, which packages to hold, which other apt sources conflict. The package
names and versions themselves: provision.rules.packages."""

from __future__ import annotations

from pyinfra.facts.apt import AptRepo

from provision.facts.gpus import Gpus
from provision.facts.system import OsInfo
from provision.inventory import Node
from provision.rules import packages as pkgs
from provision.settings import Settings


def skip_reason(node: Node, gpus: Gpus | None = None) -> str | None:
    """Why the nvidia step does not run on this host, or None when it does.

    ``gpus`` is None when only the inventory is known (the controller decides before
    contacting hosts); then ``auto`` runs and the deploy looks at lspci itself.
    """
    switch = node.settings.nvidia
    if switch == "skip":
        return "nvidia: skip"
    if switch == "force" or node.has_role("gpu_nodes"):
        return None
    if gpus is not None and not gpus.gpus:
        return "no NVIDIA GPU on the PCI bus"
    return None


def applies(node: Node) -> str | None:
    return skip_reason(node)


def driver_choice(
    settings: Settings, os_info: OsInfo, gpus: Gpus, secure_boot: bool, candidates: dict[str, str | None]
) -> pkgs.DriverChoice:
    """Which driver packages, from where. ``candidates``: apt's candidate versions of the
    signed modules and Canonical's driver package (Ubuntu). Raises ValueError with advice
    when no driver can be chosen (Secure Boot without signed modules, a bare version
    Canonical does not have)."""
    branch = settings.nvidia_driver_branch
    open_modules = pkgs.use_open_modules(settings.nvidia_kernel_modules, [g.device_id for g in gpus.gpus])
    signed = pkgs.signed_modules_package(branch, open_modules, os_info.kernel)
    source = pkgs.choose_driver_source(
        os_info, secure_boot, candidates.get(signed) is not None, settings.nvidia_driver_source
    )
    version = settings.nvidia_driver_version
    if source == "ubuntu-server":
        driver = pkgs.canonical_driver_package(branch, open_modules)
        version = pkgs.canonical_version(version, driver, candidates.get(driver))
    return pkgs.driver_packages(source, branch, version, open_modules, os_info.kernel)


def wants_fabricmanager(settings: Settings, gpus: Gpus) -> bool:
    return settings.fabric_manager == "force" or (settings.fabric_manager == "auto" and gpus.has_nvswitch)


def hold_names(installed: dict[str, str], held: set[str], explicit: list[str], branch: str) -> list[str]:
    """Packages to apt-mark hold now: the explicit ones, and every installed driver package
    of the branch (the metapackage's dependencies would otherwise still move)."""
    wanted = {n for n in explicit if n in installed}
    wanted |= {
        n
        for n, v in installed.items()
        if n.startswith(("nvidia-", "libnvidia-", "libcuda")) and v.startswith(f"{branch}.")
    }
    return sorted(wanted - held)


def other_sources(source_files: dict[str, list[AptRepo]], url: str, ours: str) -> tuple[list[str], list[str]]:
    """Other apt source files that name NVIDIA's repository: (files to remove, problems).

    apt refuses every command when two entries for one URI name different Signed-By keys,
    as NVIDIA's cuda-keyring .list and our .sources do. A sources.list.d file that names
    only this repository is removed; /etc/apt/sources.list, or a file that names other
    repositories too, is left to the user: removing it would drop those as well.
    """
    remove, problems = [], []
    for path, repos in sorted(source_files.items()):
        same = [r for r in repos if r.url.rstrip("/") == url.rstrip("/")]
        if path == ours or not same:
            continue
        if path == SOURCES_LIST or len(same) < len(repos):
            entry = f"{same[0].type} {same[0].url} {same[0].distribution}"
            problems.append(
                f"{path} names NVIDIA's CUDA repository ({entry}), which the nvidia step "
                f"configures in {ours} with another Signed-By key, and apt refuses both: remove "
                f"that entry from {path} and re-run"
            )
        else:
            remove.append(path)
    return remove, problems


SOURCES_LIST = "/etc/apt/sources.list"


def packet_header(data: bytes, i: int) -> tuple[int, int, int]:
    """(tag, body length, body start) of the OpenPGP packet at ``i`` (RFC 4880 4.2)."""
    head = data[i]
    if not head & 0x80:
        raise ValueError("not an OpenPGP packet")
    if head & 0x40:  # new-format header
        first = data[i + 1]
        if first < 192:
            return head & 0x3F, first, i + 2
        if first < 224:
            return head & 0x3F, ((first - 192) << 8) + data[i + 2] + 192, i + 3
        if first == 255:
            return head & 0x3F, int.from_bytes(data[i + 2 : i + 6], "big"), i + 6
        raise ValueError("partial lengths do not occur in a keyring")
    kind = head & 0x03  # old-format header
    if kind == 3:
        raise ValueError("indeterminate lengths do not occur in a keyring")
    n = (1, 2, 4)[kind]
    return (head >> 2) & 0x0F, int.from_bytes(data[i + 1 : i + 1 + n], "big"), i + 1 + n


def keyring_fingerprints(data: bytes) -> list[str]:
    """The fingerprints of the primary public keys of a binary OpenPGP keyring (v4: SHA-1
    of 0x99, a 2-byte length and the key packet, RFC 4880 12.2); a key of another version
    is listed as "v<N>". ValueError for anything that is not a binary keyring (an armored
    file, garbage). Standard library only: the node runs this source and packet_header's
    (operations.nvidia.fingerprint_command)."""
    import hashlib

    found, i = [], 0
    while i < len(data):
        tag, size, start = packet_header(data, i)
        body, i = data[start : start + size], start + size
        if len(body) != size:
            raise ValueError("truncated packet")
        if tag == 6 and body[:1] == b"\x04":
            found.append(hashlib.sha1(b"\x99" + size.to_bytes(2, "big") + body).hexdigest().upper())
        elif tag == 6:
            found.append(f"v{body[0] if body else 0}")
    return found
