"""The `monitoring` step: the distribution's node exporter on every host, bound to the
host's cluster address, with provision's own series in its textfile directory; on GPU
hosts, DCGM's host engine and exporter from NVIDIA's repository (declared GPU hosts) or
else the NVML collector; Prometheus with provision's alert rules on the head. See
provision.rules.monitoring for the layout and which host is the head.

The services' systemd drop-ins are written (and systemd reloaded) before the packages are
installed: the packages start their services at once, and with the drop-in already there
they start on the cluster address, never on every address. Prometheus' configuration is
checked with promtool before Prometheus is restarted on it.
"""

from __future__ import annotations

import posixpath
from io import StringIO
from pathlib import Path
from shlex import quote

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import File
from pyinfra.operations import files, server, systemd

from provision import resources
from provision.engine import Step, current_cluster, current_node, current_run, note, refuse
from provision.facts.apt import AptCandidates
from provision.facts.gpus import NvidiaDevices
from provision.facts.stack import BACKUP_STAMP
from provision.inventory import Cluster, Node
from provision.monitoring import gpu_collector
from provision.operations.apt import install
from provision.operations.stamps import follow_up
from provision.resources import render_template
from provision.rules import backups as backup_rules
from provision.rules import dcgm as dcgm_fields
from provision.rules import monitoring as layout
from provision.rules import nvidia as nvidia_rules
from provision.rules import shares as shares_layout

# Every service here restarts however often it fails: an exporter that started before
# the cluster address came up after a power cycle would otherwise stay down for good
# ("start request repeated too quickly").
RESTART = "[Unit]\nAfter=network-online.target\nWants=network-online.target\nStartLimitIntervalSec=0\n"


def drop_in(binary: str, args: list[str]) -> str:
    """A service drop-in that replaces the package's ExecStart (its $ARGS from
    /etc/default) with provision's arguments, and restarts it whatever the failure."""
    line = " ".join([binary, *args])
    return (
        "# Written by provision's monitoring step.\n"
        f"{RESTART}\n[Service]\nExecStart=\nExecStart={line}\nRestart=always\nRestartSec=5\n"
    )


def timer_units(unit: str, command: str, every_s: int, timeout_s: int, stop_post: str = "") -> dict[str, str]:
    """A oneshot service and the timer that runs it every ``every_s`` seconds; ``stop_post``
    runs after every run, killed ones included (systemd's ExecStopPost)."""
    after = f"ExecStopPost={stop_post}\n" if stop_post else ""
    return {
        f"/etc/systemd/system/{unit}.service": (
            "# Written by provision's monitoring step.\n[Unit]\nDescription=provision metrics: "
            f"{unit}\n\n[Service]\nType=oneshot\nExecStart={command}\n{after}TimeoutStartSec={timeout_s}\n"
            # a killed pass stuck in the kernel is given up after 5 s, not the default 90,
            # so what follows it (ExecStopPost) is not minutes late
            "TimeoutStopSec=5\nNice=10\n"
        ),
        f"/etc/systemd/system/{unit}.timer": (
            "# Written by provision's monitoring step.\n[Unit]\nDescription=provision metrics: "
            f"{unit} every {every_s} s\n\n[Timer]\nOnBootSec={every_s}\nOnUnitActiveSec={every_s}\n"
            "AccuracySec=1\n\n[Install]\nWantedBy=timers.target\n"
        ),
    }


def node_collector(node: Node, cluster: Cluster) -> str:
    """The node collector script for this host (see templates/monitoring/node-metrics.j2)."""
    s = node.settings
    backs_up = backup_rules.skip_reason(node, cluster) is None
    storage = cluster.storage_node()
    shares = s.nfs_exports if (storage is not None or s.nfs_server) else []
    return render_template(
        "monitoring/node-metrics.j2",
        unit=layout.NODE_COLLECTOR_UNIT,
        every_s=layout.NODE_COLLECTOR_EVERY_S,
        out=quote(f"{layout.TEXTFILE_DIR}/provision_node.prom"),
        cache=quote(layout.NODE_COLLECTOR_CACHE),
        site_glob=f"{quote(s.venv_path)}/lib/python3*/site-packages",
        backups=backs_up,
        backup_stamp=quote(BACKUP_STAMP),
        backup_timer=quote(f"/etc/systemd/system/{backup_rules.TIMER}"),
        schedule=quote(s.backup_schedule),
        # each share's path, and the same escaped as a label value (rendered here, not in sh)
        mounts=[(quote(p), quote(layout.label_value(p))) for p in shares_layout.mount_paths(s)] if shares else [],
        nfs_server=storage is not None and storage.name == node.name,
        slurm=s.slurm != "skip",
        slurm_node=quote(node.name),
    )


def collector_units(node: Node, cluster: Cluster, gpus: bool) -> dict[str, str]:
    """Every file of the collectors on this host (path -> text)."""
    units = {layout.NODE_COLLECTOR: node_collector(node, cluster)}
    units |= timer_units(
        layout.NODE_COLLECTOR_UNIT, layout.NODE_COLLECTOR, layout.NODE_COLLECTOR_EVERY_S, layout.NODE_COLLECTOR_EVERY_S
    )
    if gpus:
        units[layout.GPU_COLLECTOR] = Path(gpu_collector.__file__).read_text()
        python = posixpath.join(node.settings.venv_path, "bin", "python")
        collector = f"{python} -I {layout.GPU_COLLECTOR} --out {layout.TEXTFILE_DIR}/provision_gpu.prom"
        # A pass blocked inside the driver ignores its own SIGALRM and is killed at the unit's
        # deadline, which would leave the last pass's "up" in place: after a killed pass,
        # NVML is written down. ($$: a literal $ for the shell, not systemd's expansion.)
        down = (
            '/bin/sh -c \'case "$$SERVICE_RESULT" in success | exit-code) ;; '
            f'*) exec {collector} --down "pass killed: $$SERVICE_RESULT" ;; esac\''
        )
        units |= timer_units(
            layout.GPU_COLLECTOR_UNIT,
            f"{collector} --timeout-s {layout.GPU_COLLECTOR_TIMEOUT_S}",
            layout.GPU_COLLECTOR_EVERY_S,
            layout.GPU_COLLECTOR_TIMEOUT_S + 10,
            stop_post=down,
        )
    return units


def exporter(node: Node, cluster: Cluster) -> None:
    files.directory(name=layout.TEXTFILE_DIR, path=layout.TEXTFILE_DIR, user="root", group="root", mode="755")
    text = drop_in("/usr/bin/prometheus-node-exporter", layout.exporter_args(node))
    put = files.put(
        name="node exporter: listen on the cluster address", dest=layout.EXPORTER_DROP_IN, src=StringIO(text)
    )
    # Reloaded before the install, so the package's own start already uses the drop-in;
    # restarted after it (a unit that is not installed yet cannot be restarted), also on a
    # later run when this one stopped between the two.
    server.shell(name="node exporter: reload systemd", commands=["systemctl daemon-reload"], _if=put.did_change)
    install("Install the node exporter", [layout.EXPORTER_PACKAGE], node.settings.apt_lock_wait_s, recommends=False)
    follow_up(
        "node exporter: restart on its drop-in",
        "monitoring-exporter",
        [text],
        ["systemctl daemon-reload", f"systemctl restart {layout.EXPORTER_SERVICE}"],
        put.did_change,
    )
    systemd.service(name="node exporter running", service=layout.EXPORTER_SERVICE, running=True, enabled=True)


def dcgm(node: Node) -> None:
    """DCGM's host engine and exporter from NVIDIA's repository, the exporter on the
    cluster address with provision's field list. Refused, with the way out, where no apt
    source offers them: Prometheus on the head expects this host's exporter."""
    offered = host.get_fact(AptCandidates, packages=tuple(layout.DCGM_PACKAGES))
    missing = [p for p in layout.DCGM_PACKAGES if offered.get(p) is None]
    run = current_run()
    if missing and run.planning and "nvidia" in run.step_names and nvidia_rules.skip_reason(node) is None:
        # A plan of a host without NVIDIA's repository yet: `up` runs the nvidia step first,
        # which adds it; what DCGM's install will do cannot be shown before.
        note(f"DCGM: {', '.join(missing)} offered once the nvidia step has added NVIDIA's repository")
        return
    if missing:
        refuse(
            "monitoring",
            f"DCGM: no apt source on this host offers {', '.join(missing)} (NVIDIA's CUDA repository, "
            "which the nvidia step adds, has them); set gpu_telemetry = 'nvml' for this host to "
            "report its GPUs with provision's NVML collector instead",
        )
        return
    counters = dcgm_fields.counters_csv()
    engine = drop_in("/usr/bin/nv-hostengine", layout.dcgm_args())
    exporter = drop_in("/usr/bin/dcgm-exporter", layout.dcgm_exporter_args(node))
    puts = [
        files.put(name=f"dcgm-exporter: {layout.DCGM_COUNTERS}", dest=layout.DCGM_COUNTERS, src=StringIO(counters)),
        files.put(name="DCGM host engine: localhost only", dest=layout.DCGM_DROP_IN, src=StringIO(engine)),
        files.put(
            name="dcgm-exporter: listen on the cluster address",
            dest=layout.DCGM_EXPORTER_DROP_IN,
            src=StringIO(exporter),
        ),
    ]
    # As for the node exporter: the drop-ins are in place before the packages start the
    # services, so neither ever listens where it should not.
    server.shell(
        name="DCGM: reload systemd", commands=["systemctl daemon-reload"], _if=lambda: any(p.did_change() for p in puts)
    )
    install("Install DCGM and its exporter", layout.DCGM_PACKAGES, node.settings.apt_lock_wait_s, recommends=False)
    follow_up(
        "DCGM: restart on its drop-ins",
        "monitoring-dcgm",
        [counters, engine, exporter],
        [
            "systemctl daemon-reload",
            f"systemctl restart {layout.DCGM_SERVICE}",
            f"systemctl restart {layout.DCGM_EXPORTER_SERVICE}",
        ],
        lambda: any(p.did_change() for p in puts),
    )
    systemd.service(name="DCGM host engine running", service=layout.DCGM_SERVICE, running=True, enabled=True)
    systemd.service(name="dcgm-exporter running", service=layout.DCGM_EXPORTER_SERVICE, running=True, enabled=True)


def collectors(node: Node, cluster: Cluster) -> None:
    devices = host.get_fact(NvidiaDevices)
    # The NVML collector where GPUs are found and DCGM does not report them.
    gpus = bool(devices.gpus) and node.settings.nvidia != "skip" and not layout.uses_dcgm(node)
    units = collector_units(node, cluster, gpus)
    changed = []
    for path, text in units.items():
        mode = "755" if path.startswith("/usr/local/") else "644"
        changed.append(files.put(name=path, dest=path, src=StringIO(text), mode=mode))
    follow_up(
        "collectors: reload systemd",
        "monitoring-collectors",
        [f"{path}\n{text}" for path, text in sorted(units.items())],
        # the first pass now, so the series are there right after up
        ["systemctl daemon-reload", *[f"systemctl start --no-block {u}.service" for u in _timers(gpus)]],
        lambda: any(c.did_change() for c in changed),
    )
    for unit in _timers(gpus):
        systemd.service(name=f"{unit}.timer enabled", service=f"{unit}.timer", running=True, enabled=True)
    if not gpus:  # a host whose GPUs went away (skipped, or DCGM's now) keeps no stale NVML series
        _no_nvml_collector()


def _no_nvml_collector() -> None:
    """The NVML collector gone: its timer stopped and disabled (else it would fail every 30 s
    on its missing script), its units, script and series removed."""
    timer = f"{layout.GPU_COLLECTOR_UNIT}.timer"
    units = [f"/etc/systemd/system/{timer}", f"/etc/systemd/system/{layout.GPU_COLLECTOR_UNIT}.service"]
    if host.get_fact(File, path=units[0]):
        server.shell(
            name="NVML collector: timer stopped and disabled",
            commands=[
                f"systemctl disable --now {timer}",
                f"systemctl reset-failed {layout.GPU_COLLECTOR_UNIT}.service || true",
            ],
        )
    removed = [
        files.file(name=f"no {path}", path=path, present=False)
        for path in [*units, layout.GPU_COLLECTOR, f"{layout.TEXTFILE_DIR}/provision_gpu.prom"]
    ]
    server.shell(
        name="NVML collector: reload systemd",
        commands=["systemctl daemon-reload"],
        _if=lambda: any(r.did_change() for r in removed[:2]),
    )


def _timers(gpus: bool) -> list[str]:
    return [layout.NODE_COLLECTOR_UNIT] + ([layout.GPU_COLLECTOR_UNIT] if gpus else [])


def prometheus(node: Node, cluster: Cluster) -> None:
    config = layout.scrape_config(cluster)
    rules = (resources.templates_dir() / "monitoring" / "alerts.yml").read_text()
    recorded = dcgm_fields.recording_rules()
    service = drop_in("/usr/bin/prometheus", layout.prometheus_args(node))
    service_put = files.put(
        name="prometheus: listen on the cluster address", dest=layout.PROMETHEUS_DROP_IN, src=StringIO(service)
    )
    puts = [
        files.put(name=f"prometheus: {layout.CONFIG}", dest=layout.CONFIG, src=StringIO(config), mode="644"),
        files.put(name=f"prometheus: {layout.RULES}", dest=layout.RULES, src=StringIO(rules), mode="644"),
        files.put(name=f"prometheus: {layout.DCGM_RULES}", dest=layout.DCGM_RULES, src=StringIO(recorded), mode="644"),
        service_put,
    ]
    server.shell(name="prometheus: reload systemd", commands=["systemctl daemon-reload"], _if=service_put.did_change)
    install("Install Prometheus", [layout.PROMETHEUS_PACKAGE], node.settings.apt_lock_wait_s, recommends=False)
    refused = quote(f"promtool refused {layout.CONFIG}; Prometheus keeps running on its last configuration")
    follow_up(
        "prometheus: check the configuration, restart",
        layout.PROMETHEUS_STAMP,
        [config, rules, recorded, service],
        [
            "systemctl daemon-reload",
            f"promtool check config {quote(layout.CONFIG)} || {{ echo {refused} >&2; exit 1; }}",
            f"systemctl restart {layout.PROMETHEUS_SERVICE}",
        ],
        lambda: any(p.did_change() for p in puts),
    )
    systemd.service(name="prometheus running", service=layout.PROMETHEUS_SERVICE, running=True, enabled=True)


@deploy("Monitoring")
def monitoring() -> None:
    node = current_node()
    cluster = current_cluster()
    exporter(node, cluster)
    collectors(node, cluster)
    if layout.uses_dcgm(node):
        dcgm(node)
    head = layout.prometheus_node(cluster)
    if head is not None and head.name == node.name:
        prometheus(node, cluster)


def applies(node: Node) -> str | None:
    return None if node.settings.monitoring else "monitoring = false"


step = Step(
    "monitoring",
    monitoring,
    "node exporter on the cluster address, provision's series, NVML's or DCGM's, Prometheus with alerts on the head",
    applies,
)
