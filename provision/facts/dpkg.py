"""dpkg's package list as the facts print it, read the same way by every fact that needs it
(the apt holds of the nvidia step, the installed stack of `provision status`)."""

from __future__ import annotations

# One line per package dpkg knows: "pkg NAME VERSION STATUS-ABBREV".
LIST_COMMAND = "dpkg-query -W -f='pkg ${Package} ${Version} ${db:Status-Abbrev}\\n' 2>/dev/null"


def installed_package(line: str) -> tuple[str, str] | None:
    """(name, version) when the line is an installed package, else None.

    The status abbreviation is the desired state, then the status: "ii" installed, "hi"
    installed and held, "rc" removed with its config left. The second letter says installed,
    whatever the first one wants."""
    parts = line.split()
    if len(parts) >= 4 and parts[0] == "pkg" and parts[3][1:2] == "i":
        return parts[1], parts[2]
    return None
