"""The house rules, enforced: imports point down the layers, no deploy imports another, and
no import cycles. docs/ARCHITECTURE.md draws the same layers; change both together."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "provision"

# Top to bottom. A module may import its own layer's siblings only where ALLOWED says so,
# and any layer below its own. Each entry is a module or a package prefix.
LAYERS: list[tuple[str, ...]] = [
    ("provision.__main__",),
    ("provision.cli",),
    (
        "provision.up",
        "provision.validate",
        "provision.launch",
        "provision.backup",
        "provision.status",
        "provision.testbed",
        "provision.demo",
        "provision.verify",
        "provision.tune",
        "provision.jobs",
        "provision.monitoring",
    ),
    ("provision.deploys",),
    ("provision.scheduler",),
    ("provision.engine", "provision.remote"),
    ("provision.operations",),
    ("provision.rules",),
    ("provision.facts",),
    ("provision.limit",),
    ("provision.inventory",),
    ("provision.inventory_checks", "provision.pyinfra_keys"),
    ("provision.cluster",),
    ("provision.settings",),
    ("provision.verdicts",),
    (
        "provision.state",
        "provision.resources",
        "provision.metrics",
        "provision.hostkeys",
        "provision.values",
        "provision.inventory_file",
        "provision.controller_files",
        "provision.openfiles",
        # uploaded to GPU hosts by the monitoring step and run there alone: imports nothing
        "provision.monitoring.gpu_collector",
    ),
    ("provision.errors", "provision.pyinfra_context", "provision"),
]

# Imports between siblings of one layer that the architecture allows, each with its reason.
ALLOWED: dict[tuple[str, str], str] = {
    ("provision.status", "provision.validate"): "status reports the last verdict validate recorded (its history)",
    (
        "provision.tune",
        "provision.launch",
    ): "a sweep's trial is a train launch: tune takes the trainer's presets from it",
    (
        "provision.tune",
        "provision.jobs",
    ): "a sweep of the user's own program runs each trial as a job",
    (
        "provision.jobs",
        "provision.launch",
    ): "a job starts as train does: launch's node directories, run-as probe, reaper, log sink and stop signals",
    (
        "provision.inventory_file",
        "provision.values",
    ): "a host name from the file is printed by values' one rule for untrusted text (shown)",
}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """provision modules this file imports, at any depth (lazy imports count too);
    ``from pkg import mod`` counts as importing pkg.mod."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "provision" or node.module.startswith("provision."):
                subs = {f"{node.module}.{a.name}" for a in node.names}
                modules = {s for s in subs if _is_module(s)}
                found |= modules | ({node.module} if subs - modules else set())
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("provision.")}
    return found


def _slot(module: str) -> tuple[int, str]:
    """(layer index, the layer entry that owns the module); the longest prefix wins."""
    best = None
    for index, layer in enumerate(LAYERS):
        for entry in layer:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > len(best[1])):
                best = (index, entry)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and to docs/ARCHITECTURE.md"
    return best


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, imported in sorted(graph.items()):
        layer, owner = _slot(module)
        for target in sorted(imported):
            t_layer, t_owner = _slot(target)
            upward = t_layer < layer
            sibling = t_layer == layer and t_owner != owner and (owner, t_owner) not in ALLOWED
            if upward or sibling:
                bad.append(f"{module} imports {target} ({'upward' if upward else 'sibling'})")
    return bad


def test_every_import_points_down_the_layers() -> None:
    assert _violations(_graph()) == []


def _deploy(module: str) -> str | None:
    """The deploy a module belongs to: provision.deploys.<name>, a module or a package of its
    own parts (deploys/slurm/: the step, its accounting, its roster)."""
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["provision", "deploys"] and len(parts) > 2 else None


def test_no_deploy_imports_another_deploy() -> None:
    graph = _graph()
    crossing = [
        f"{m} -> {t}" for m, ts in graph.items() if _deploy(m) for t in ts if _deploy(t) and _deploy(t) != _deploy(m)
    ]
    assert crossing == []


def test_there_are_no_import_cycles() -> None:
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize(
    ("module", "target", "expected"),
    [
        ("provision.settings", "provision.validate.judge", "upward"),
        ("provision.deploys.nfs", "provision.deploys.base", None),  # same package: the deploy test catches it
        ("provision.status.gather", "provision.validate.history", None),  # allowed sibling
        ("provision.status.gather", "provision.launch.plan", "sibling"),
        ("provision.cli.up", "provision.engine", None),
    ],
)
def test_the_layer_check_itself_tells_up_from_down(module, target, expected) -> None:
    bad = _violations({module: {target}})
    assert bad == ([] if expected is None else [f"{module} imports {target} ({expected})"])
