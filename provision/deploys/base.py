"""Base: what every training node needs before drivers and frameworks.

An apt lock timeout for every later apt run, packages, time sync (chrony), memlock/nofile
limits, networking sysctls, /etc/hosts entries for every node's cluster address, the
training user with an SSH key that lets nodes reach each other, and an
unattended-upgrades blacklist for NVIDIA/CUDA packages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from io import BytesIO, StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FileContents
from pyinfra.operations import apt, files, server, systemd

from provision import values as v
from provision.engine import Step, current_cluster, current_node, each_connected_host, note, once_per_pass, put_secret
from provision.facts import chrony
from provision.facts.nics import Nics
from provision.facts.probes import CloudInitFact, DpkgInterrupted, HostKeys
from provision.inventory import Cluster, Node
from provision.operations import time_sync as time_sync_ops
from provision.operations.accounts import training_account
from provision.operations.hosts import HOSTS_MARKER, hosts_first, shadowing_lines
from provision.operations.stamps import follow_up
from provision.resources import render_template, templates_dir
from provision.rules import cluster_env
from provision.rules.packages import BASE_PACKAGES, UNATTENDED_BLACKLIST
from provision.settings import Settings
from provision.state import generated_key, inventory_dir

SYSCTL_FILE = "/etc/sysctl.d/90-provision-network.conf"
LIMITS_FILE = "/etc/security/limits.d/90-provision.conf"
UNATTENDED_FILE = "/etc/apt/apt.conf.d/51provision-unattended-upgrades"
APT_LOCK_FILE = "/etc/apt/apt.conf.d/90provision-dpkg-lock-timeout"
CLOUD_INIT_HOSTS = "/etc/cloud/cloud.cfg.d/99-provision-etc-hosts.cfg"
CLOUD_INIT_TEXT = """\
# Written by provision. cloud-init must not rewrite /etc/hosts at boot: it would drop the
# cluster nodes' names that provision keeps there (with manage_etc_hosts: true it renders
# /etc/hosts from its template on every boot). Later files in cloud.cfg.d win, hence 99.
manage_etc_hosts: false
"""


def training_key(cluster: Cluster, user: str) -> Path:
    """The cluster's training-user private key on the controller, generated once.

    One key pair per inventory file (named by its path), so two clusters never share one.
    """
    return generated_key(inventory_dir(cluster.path) / f"{user}_ed25519", f"{user}@provision")


def hosts_block(nodes: list[Node]) -> str:
    """/etc/hosts lines: every node's cluster address and name. A node whose cluster address
    is a DNS name (no cluster_address, and SSH by name) is left to DNS: /etc/hosts maps
    addresses to names, and a line of two names means nothing."""
    return "\n".join(f"{n.cluster_address} {n.name}" for n in nodes if v.is_ip(n.cluster_address))


def known_hosts_lines(keys_by_node: dict[str, tuple[str, list[str]]]) -> str:
    """known_hosts for the training user: name -> (cluster address, ["type key", ...])."""
    lines = []
    for name, (address, keys) in sorted(keys_by_node.items()):
        names = name if name == address else f"{name},{address}"
        lines += [f"{names} {key}" for key in keys]
    return "\n".join(lines) + "\n"


def carried_keys(names: list[str], existing: list[str] | None) -> dict[str, list[str]]:
    """Host keys of the named nodes as the host's current known_hosts has them: name ->
    ["type key", ...]. A run that does not reach every node (``--limit``, a host down)
    keeps the lines of the nodes it did not read, instead of dropping them and breaking the
    training user's SSH to those nodes. The file is the training user's own: what it says
    is only ever handed back to the same user."""
    wanted = set(names)
    carried: dict[str, list[str]] = {}
    for line in existing or []:
        fields = line.split()
        if len(fields) < 3 or line.lstrip().startswith("#"):
            continue
        name = fields[0].split(",")[0]
        if name in wanted:
            carried.setdefault(name, []).append(f"{fields[1]} {fields[2]}")
    return carried


def cluster_host_keys() -> dict[str, list[str]]:
    """Host keys of every host in this pass, read once per pass (each host's own fact)."""
    return once_per_pass("host keys", lambda: each_connected_host(lambda h: h.get_fact(HostKeys)))


def keys_by_node(nodes: Iterable[Node], keys: dict[str, list[str]]) -> dict[str, tuple[str, list[str]]]:
    """name -> (cluster address, host keys) of the nodes whose keys are known."""
    return {n.name: (n.cluster_address, keys[n.name]) for n in nodes if keys.get(n.name)}


def pass_known_hosts(by_node: Callable[[], dict[str, tuple[str, list[str]]]]) -> bytes:
    """The training user's known_hosts when every node's keys were read in this pass: the
    same text for every host, so made once per pass and shared. Each host's own copy (a
    StringIO per host, four bytes a character) made the controller hold the fleet's size
    squared: 650 MB at 1,000 simulated hosts (BENCHMARKS.md, issue 20); each host's own
    name-to-keys map was the fleet's size squared in CPU."""
    return once_per_pass("known_hosts", lambda: known_hosts_lines(by_node()).encode())


def apt_lock_conf(seconds: int) -> str:
    """apt.conf text that makes every apt run wait up to ``seconds`` for the dpkg lock."""
    return (
        "// Written by provision (apt_lock_wait_s). After provision reboots a host, apt-daily and\n"
        "// unattended-upgrades often start while later steps install packages or hold the driver;\n"
        '// without a timeout apt fails at once with "Could not get lock". apt >= 1.9.11 reads this.\n'
        f'DPkg::Lock::Timeout "{seconds}";\n'
    )


def apt_lock_timeout(settings: Settings) -> None:
    """Every apt run on the host (this step's, nvidia's, the storage steps') waits for the
    dpkg lock; preflight's wait covers only the moment before base. apt has no such timeout
    for the lists lock that `apt-get update` takes (apt 2.6 fails at once on it)."""
    files.put(
        name="apt: wait for the dpkg lock (apt_lock_wait_s)",
        src=StringIO(apt_lock_conf(settings.apt_lock_wait_s)),
        dest=APT_LOCK_FILE,
    )


def packages(node: Node) -> None:
    settings = node.settings
    if host.get_fact(DpkgInterrupted):
        # A host that lost power mid-install (or a killed VM) comes back with dpkg's run
        # unfinished, and apt refuses every install until it is finished.
        note("base: finished a dpkg run that had been interrupted (dpkg --configure -a)")
        server.shell(
            name="Finish an interrupted dpkg run",
            commands=["DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold --configure -a"],
        )
    apt.packages(
        name="Install base packages",
        packages=BASE_PACKAGES,
        update=True,
        cache_time=settings.apt_cache_valid_s,
        no_recommends=True,  # waits for the dpkg lock by APT_LOCK_FILE, written before it
    )


def time_sync(node: Node) -> None:
    """chrony with the inventory's ntp_servers as its only sources, or the distribution's
    pool when there are none (operations/time_sync.py)."""
    servers = node.settings.ntp_servers
    text = render_template("base/chrony-sources.j2", servers=servers) if servers else ""
    sources = (
        files.put(name="chrony servers (ntp_servers)", dest=chrony.OURS, src=StringIO(text))
        if servers
        else files.file(name="chrony: distribution pool (no ntp_servers)", path=chrony.OURS, present=False)
    )
    pools = time_sync_ops.distribution_sources(
        name="chrony: distribution pool " + ("parked (ntp_servers)" if servers else "in force"),
        present=not servers,
        sources=host.get_fact(chrony.ChronySourcesFact),
    )
    systemd.service(name="chrony running", service="chrony", running=True, enabled=True)
    # chrony reads its sources at start: restarted when they changed, in this run or in
    # one stopped before it got here (the stamp holds the sources it last restarted for).
    follow_up(
        "chrony: reload servers",
        time_sync_ops.RESTART_STAMP,
        [text],  # "" while the pool is in force; parking or unparking also drops the stamp
        ["systemctl restart chrony"],
        lambda: sources.did_change() or pools.did_change(),
    )


def system_settings() -> None:
    node = current_node()
    files.template(
        name="memlock/nofile limits",
        src=str(templates_dir() / "base" / "limits.conf.j2"),
        dest=LIMITS_FILE,
        nofile=node.settings.nofile_limit,
    )
    sysctl_text = render_template("base/sysctl-network.conf.j2")
    sysctl = files.put(name="networking sysctls", dest=SYSCTL_FILE, src=StringIO(sysctl_text))
    follow_up(
        "apply networking sysctls", "sysctl-network", [sysctl_text], [f"sysctl -q -p {SYSCTL_FILE}"], sysctl.did_change
    )
    files.template(
        name="unattended-upgrades: never NVIDIA/CUDA",
        src=str(templates_dir() / "base" / "unattended-upgrades.j2"),
        dest=UNATTENDED_FILE,
        blacklist=UNATTENDED_BLACKLIST,
    )


def cloud_init_leaves_hosts() -> None:
    """Keep cloud-init's hands off /etc/hosts (the block would not survive the driver reboot)."""
    cloud = host.get_fact(CloudInitFact)
    if not cloud.installed:
        return
    files.put(
        name="cloud-init: leave /etc/hosts to provision",
        src=StringIO(CLOUD_INIT_TEXT),
        dest=CLOUD_INIT_HOSTS,
        mode="644",
    )
    if cloud.overriding:
        note(
            f"base: {', '.join(cloud.overriding)} sets cloud-init's manage_etc_hosts, which outranks "
            f"{CLOUD_INIT_HOSTS}: the next boot rewrites /etc/hosts without the cluster nodes; "
            "set manage_etc_hosts: false there (the provider's user-data), then run up again"
        )


def cluster_names() -> None:
    cloud_init_leaves_hosts()
    cluster = current_cluster()
    # The same for every host: made once per pass (per host, the fleet's size squared).
    block = once_per_pass("hosts block", lambda: hosts_block(list(cluster.all_nodes)))  # also on --limit
    addresses = once_per_pass(
        "cluster addresses",  # as hosts_block: a node known by DNS name has no line to shadow
        lambda: {n.name: n.cluster_address for n in cluster.all_nodes if v.is_ip(n.cluster_address)},
    )
    shadowed = shadowing_lines(host.get_fact(FileContents, path="/etc/hosts"), addresses)
    if shadowed:
        hosts_first(
            name="/etc/hosts: cluster nodes first (above " + "; ".join(s.strip() for s in shadowed) + ")",
            block=block,
            shadowed=shadowed,
        )
        return
    files.block(name="/etc/hosts: cluster nodes", path="/etc/hosts", content=block, marker=HOSTS_MARKER)


def cluster_interface() -> None:
    """NCCL's and gloo's interface for every job on this node (rules/cluster_env): the
    cluster_interface setting, else the interface that holds the cluster address."""
    node = current_node()
    interface = node.settings.cluster_interface or cluster_env.interface_of(
        node.cluster_address,
        host.get_fact(Nics) or [],  # None: no `ip` on the host
    )
    if interface is None:
        note(
            f"base: no interface holds cluster address {node.cluster_address}: jobs get no "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; set cluster_interface"
        )
        return
    for key, line in cluster_env.environment_lines(interface).items():
        files.line(
            name=f"{cluster_env.ENVIRONMENT_FILE}: {line}",
            path=cluster_env.ENVIRONMENT_FILE,
            line=f"^{key}=.*$",
            replace=line,
        )


def training_user() -> None:
    node = current_node()
    cluster = current_cluster()
    user = node.settings.training_user
    home = f"/home/{user}"
    key = training_key(cluster, user)
    public = Path(f"{key}.pub").read_text().strip()
    training_account(node.settings)
    files.directory(name=f"{home}/.ssh", path=f"{home}/.ssh", user=user, group=user, mode="700")
    # put_secret: never readable by another user, and no diff in `provision plan`.
    put_secret("training user: private key", str(key), f"{home}/.ssh/id_ed25519", user, user)
    files.put(
        name="training user: authorized key",
        src=StringIO(public + "\n"),
        dest=f"{home}/.ssh/authorized_keys",
        user=user,
        group=user,
        mode="600",
    )
    keys = cluster_host_keys()
    unread = once_per_pass("unread host keys", lambda: [n.name for n in cluster.all_nodes if not keys.get(n.name)])
    if unread:
        keys = keys | carried_keys(unread, host.get_fact(FileContents, path=f"{home}/.ssh/known_hosts"))
        text = known_hosts_lines(keys_by_node(cluster.all_nodes, keys)).encode()
    else:  # BytesIO shares the bytes it is given: one copy of the text for the whole pass.
        text = pass_known_hosts(lambda: keys_by_node(cluster.all_nodes, keys))
    files.put(
        name="training user: known_hosts (every node's host keys)",
        src=BytesIO(text),
        dest=f"{home}/.ssh/known_hosts",
        user=user,
        group=user,
        mode="644",
    )


@deploy("Base")
def base() -> None:
    node = current_node()
    apt_lock_timeout(node.settings)
    packages(node)
    time_sync(node)
    system_settings()
    cluster_names()
    cluster_interface()
    training_user()


step = Step(
    "base",
    base,
    "packages, chrony, limits, sysctls, /etc/hosts, the cluster interface for jobs, training user and SSH keys",
)
