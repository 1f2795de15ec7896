"""The testbed takes its Debian mirror from the machine's own apt configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.errors import InputError
from provision.testbed import apt_sources

# The debian.sources of a Debian 12 build machine (mirror host replaced by a test name).
DEBIAN_SOURCES = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.test/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""

DISABLED_AND_SRC = """\
Types: deb
URIs: http://disabled.test/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://src.test/debian
Suites: bookworm
Components: main
"""


def test_deb822_stanzas_are_parsed_with_comments_skipped() -> None:
    sources = apt_sources.parse_deb822(DEBIAN_SOURCES, "debian.sources")
    assert [s.uris for s in sources] == [("http://mirror.test/debian",), ("http://mirror.test/debian-security",)]
    assert sources[0].suites == ("bookworm", "bookworm-updates")
    assert sources[0].components == ("main",)


def test_deb822_continuation_lines_join_the_field() -> None:
    text = "Types: deb\nURIs: http://a.test/debian\n http://b.test/debian\nSuites: bookworm\nComponents: main\n"
    assert apt_sources.parse_deb822(text)[0].uris == ("http://a.test/debian", "http://b.test/debian")


def test_deb822_disabled_stanzas_are_dropped() -> None:
    sources = apt_sources.parse_deb822(DISABLED_AND_SRC)
    assert [(s.types, s.uris) for s in sources] == [(("deb-src",), ("http://src.test/debian",))]


def test_one_line_entries_drop_options_and_comments() -> None:
    text = (
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.test/debian bookworm main contrib\n"
        "deb-src http://mirror.test/debian bookworm main\n"
        "deb http://mirror.test/debian-security bookworm-security main # trailing\n"
    )
    sources = apt_sources.parse_one_line(text, "sources.list")
    assert [(s.types, s.uris, s.suites, s.components) for s in sources] == [
        (("deb",), ("http://mirror.test/debian",), ("bookworm",), ("main", "contrib")),
        (("deb-src",), ("http://mirror.test/debian",), ("bookworm",), ("main",)),
        (("deb",), ("http://mirror.test/debian-security",), ("bookworm-security",), ("main",)),
    ]


def test_mirror_is_the_source_carrying_the_release_and_guests_get_its_suites() -> None:
    other = apt_sources.parse_deb822("Types: deb\nURIs: https://vendor.test/apt\nSuites: nodistro\nComponents: main\n")
    mirror = apt_sources.debian_mirror(other + apt_sources.parse_deb822(DEBIAN_SOURCES))
    assert mirror.uri == "http://mirror.test/debian"
    text = apt_sources.guest_sources(mirror)
    assert "URIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates\n" in text
    assert "URIs: http://mirror.test/debian-security\nSuites: bookworm-security\n" in text
    assert "vendor.test" not in text
    assert text.count(f"Signed-By: {apt_sources.GUEST_KEYRING}") == 2


def test_no_source_for_the_release_is_bad_input_with_a_fix() -> None:
    ubuntu = apt_sources.parse_one_line("deb http://archive.test/ubuntu jammy main\n")
    with pytest.raises(InputError) as raised:
        apt_sources.debian_mirror(ubuntu)
    assert "bookworm" in raised.value.problems[0].what
    assert "--mirror" in raised.value.problems[0].fix


def test_system_sources_read_the_files_apt_reads_and_skip_others(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://one.test/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEBIAN_SOURCES)
    (tmp_path / "sources.list.d" / "extra.list").write_text("deb http://two.test/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "old.list.disabled").write_text("deb http://no.test/debian bookworm main\n")
    uris = [s.uris[0] for s in apt_sources.read_system_sources(tmp_path)]
    assert uris == [
        "http://one.test/debian",
        "http://mirror.test/debian",
        "http://mirror.test/debian-security",
        "http://two.test/debian",
    ]


def test_an_explicit_mirror_gives_release_and_updates() -> None:
    mirror = apt_sources.mirror_from_uri("http://given.test/debian")
    assert mirror.uri == "http://given.test/debian"
    assert "Suites: bookworm bookworm-updates\n" in apt_sources.guest_sources(mirror)
