"""apt facts provision needs beyond pyinfra's: which file names which repository, and
which version apt would install of a package.

pyinfra's ``apt.AptSources`` reads the same files but returns one flat list, so it cannot
say which file to remove; this fact runs its command and parsers and keeps the file.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase
from pyinfra.facts.apt import AptRepo, AptSources, AptSourcesFile, parse_apt_list_file

# AptSources' command starts each file's text with this line.
FILE_MARKER = "##PYINFRA_FILE "


def parse_source_files(lines: list[str]) -> dict[str, list[AptRepo]]:
    """Path -> the enabled entries in it (one-line .list format or deb822 .sources)."""
    texts: dict[str, list[str]] = {}
    current = None
    for line in lines:
        if line.startswith(FILE_MARKER):
            current = line[len(FILE_MARKER) :].strip()
            texts[current] = []
        elif current is not None:
            texts[current].append(line)
    return {
        path: (AptSourcesFile.parse_sources_file(text) if path.endswith(".sources") else parse_apt_list_file(text))
        for path, text in texts.items()
    }


class AptSourceFiles(AptSources):
    """/etc/apt/sources.list and every sources.list.d/*.list and *.sources, with the
    repositories each names. Example:

    .. code:: python

        files = host.get_fact(AptSourceFiles)
        naming = [path for path, repos in files.items() if any(r.url == url for r in repos)]
    """

    default = dict  # type: ignore[assignment]  # a dict of files, not AptSources' flat list

    def process(self, output: list[str]) -> dict[str, list[AptRepo]]:
        return parse_source_files(output)


class AptCandidates(FactBase[dict[str, str | None]]):
    """apt's candidate version of each package named, None where no source offers it.

    .. code:: python

        offered = host.get_fact(AptCandidates, packages=("datacenter-gpu-manager-exporter",))
    """

    def command(self, packages: tuple[str, ...] = ()) -> str:
        names = " ".join(shlex.quote(p) for p in packages)
        return (
            f'for p in {names}; do printf "%s=%s\\n" "$p" '
            '"$(apt-cache policy "$p" 2>/dev/null | awk \'/Candidate:/ {print $2}\')"; done'
        )

    def process(self, output: list[str]) -> dict[str, str | None]:
        return parse_candidates(output)

    @staticmethod
    def default() -> dict[str, str | None]:
        return {}


def candidate_version(value: str | None) -> str | None:
    """A candidate version as apt prints it: empty, or apt's ``(none)``, is None (apt has
    no version of the package to install)."""
    value = (value or "").strip()
    return None if value in ("", "(none)") else value


def parse_candidates(lines: list[str]) -> dict[str, str | None]:
    """``package=version`` lines, each version read by candidate_version."""
    found: dict[str, str | None] = {}
    for line in lines:
        name, sep, version = line.strip().partition("=")
        if sep and name:
            found[name] = candidate_version(version)
    return found
