"""Find the files that ship beside the package: templates/, training/, inventories/.

In a source checkout (and an editable install) they sit at the repository root, next to
the package. In a wheel, pyproject's force-include puts them under provision/_bundled/.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the directory of a bundled resource tree ("templates", "training", ...)."""
    for candidate in (_PACKAGE / "_bundled" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled directory {name!r} not found beside {_PACKAGE}")


def templates_dir() -> Path:
    return resource_dir("templates")


def training_script() -> Path:
    return resource_dir("training") / "train_ddp.py"


def inventories_dir() -> Path:
    return resource_dir("inventories")


def render_template(name: str, **values: object) -> str:
    """Render templates/<name> (e.g. "nfs/exports.j2") as pyinfra's files.template would;
    deploys upload the text, so tests check exactly what a host receives."""
    from pyinfra.api.util import get_template

    return str(get_template(str(templates_dir() / name)).render(**values))
