"""The machine's own apt configuration, parsed as text: which Debian mirror to build the
image from and which sources the guests use. No mirror host is ever written in the code;
a controller without a Debian mirror configured is told to pass one.

Both formats apt reads are handled: deb822 ``*.sources`` stanzas and one-line
``sources.list`` entries. Files apt itself ignores (other suffixes, ``Enabled: no``) are
ignored here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from provision.errors import InputError, Problem

GUEST_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class AptSource:
    """One apt source entry (a deb822 stanza or one sources.list line)."""

    types: tuple[str, ...]  # "deb", "deb-src"
    uris: tuple[str, ...]  # archive roots, e.g. http://mirror.example/debian
    suites: tuple[str, ...]  # "bookworm", "bookworm-updates", ...
    components: tuple[str, ...]  # "main", "contrib", ...
    origin: str  # file it came from, for messages


@dataclass(frozen=True)
class Mirror:
    """What the image build needs: the mirror for debootstrap and the guest's sources."""

    uri: str  # archive root that carries the release itself, for debootstrap
    suite: str  # the release codename, e.g. "bookworm"
    entries: tuple[AptSource, ...]  # sources the guests get: only this release's suites


def parse_deb822(text: str, origin: str = "<text>") -> list[AptSource]:
    """Parse a deb822 ``.sources`` file. Stanzas with ``Enabled: no`` are dropped."""
    sources = []
    for stanza in re.split(r"\n\s*\n", text):
        fields = _deb822_fields(stanza)
        if not fields or fields.get("enabled", "yes").lower() == "no":
            continue
        sources.append(
            AptSource(
                types=tuple(fields.get("types", "").split()),
                uris=tuple(fields.get("uris", "").split()),
                suites=tuple(fields.get("suites", "").split()),
                components=tuple(fields.get("components", "").split()),
                origin=origin,
            )
        )
    return [s for s in sources if s.types and s.uris and s.suites]


def _deb822_fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    key = None
    for line in stanza.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line[0] in " \t" and key:  # continuation of the previous field
            fields[key] += " " + line.strip()
            continue
        if ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
    return fields


def parse_one_line(text: str, origin: str = "<text>") -> list[AptSource]:
    """Parse one-line ``sources.list`` entries: ``deb [options] URI SUITE COMPONENT...``."""
    sources = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)  # [arch=amd64 signed-by=...] options
        parts = line.split()
        if len(parts) < 3 or parts[0] not in ("deb", "deb-src"):
            continue
        sources.append(AptSource((parts[0],), (parts[1],), (parts[2],), tuple(parts[3:]), origin))
    return sources


def read_system_sources(apt_dir: str | Path = "/etc/apt") -> list[AptSource]:
    """Every enabled source of the machine, in the order apt reads the files."""
    apt_dir = Path(apt_dir)
    sources: list[AptSource] = []
    main_list = apt_dir / "sources.list"
    if main_list.is_file():
        sources += parse_one_line(main_list.read_text(errors="replace"), str(main_list))
    parts = apt_dir / "sources.list.d"
    for path in sorted(parts.glob("*")) if parts.is_dir() else []:
        if path.suffix == ".list":
            sources += parse_one_line(path.read_text(errors="replace"), str(path))
        elif path.suffix == ".sources":
            sources += parse_deb822(path.read_text(errors="replace"), str(path))
    return sources


def debian_mirror(sources: list[AptSource], suite: str = "bookworm") -> Mirror:
    """The mirror carrying ``suite`` and the guest's entries (``suite`` and ``suite-*``).

    Raises InputError when no enabled binary source carries the release.
    """
    binary = [s for s in sources if "deb" in s.types]
    release = [s for s in binary if suite in s.suites and "main" in s.components]
    if not release:
        raise InputError(
            Problem(
                "apt configuration (/etc/apt/sources.list, /etc/apt/sources.list.d/)",
                f"no enabled 'deb' source carries Debian {suite} main",
                "pass the Debian mirror to use with --mirror URL (or Testbed(mirror=...))",
            )
        )
    entries = []
    for s in binary:
        suites = tuple(x for x in s.suites if x == suite or x.startswith(suite + "-"))
        if suites:
            entries.append(AptSource(("deb",), s.uris, suites, s.components, s.origin))
    return Mirror(release[0].uris[0], suite, tuple(entries))


def mirror_from_uri(uri: str, suite: str = "bookworm") -> Mirror:
    """A Mirror given explicitly (controllers without a Debian source, e.g. Ubuntu).
    InputError unless it is an http(s) or file URL: it is written into the guest's deb822
    sources, where a line of its own ("Trusted: yes") would be a field."""
    from provision import values

    problem = values.url(uri)
    if problem:
        raise InputError(Problem("--mirror", problem, "e.g. --mirror http://mirror.example.org/debian"))
    return Mirror(uri, suite, (AptSource(("deb",), (uri,), (suite, f"{suite}-updates"), ("main",), "--mirror"),))


def guest_sources(mirror: Mirror) -> str:
    """The guest's /etc/apt/sources.list.d/debian.sources, deb822, same mirror as the build."""
    stanzas = []
    for s in mirror.entries:
        stanzas.append(
            f"Types: deb\nURIs: {' '.join(s.uris)}\nSuites: {' '.join(s.suites)}\n"
            f"Components: {' '.join(s.components)}\nSigned-By: {GUEST_KEYRING}\n"
        )
    return "\n".join(stanzas)
