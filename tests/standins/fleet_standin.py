"""A simulated fleet for tests and benchmarks: a stand-in for pyinfra's ssh connector
whose hosts answer every command from outputs captured on a real host, after a set
latency, and of which a chosen share refuse connections, fail every command, or hang.

The seam: pyinfra gives every host without an ``@connector/`` prefix the connector
registered as ``ssh`` among the ``pyinfra.connectors`` entry points, looked up through
``pyinfra.api.inventory.get_execution_connectors``. ``simulated(fleet)`` puts this
connector there for as long as it is held, so a real inventory file (plain host names,
real settings) loads and runs through unchanged product code, which never knows.

The fabric side (provision.remote, the one module that opens fabric connections) is
simulated the same way while ``simulated(fleet)`` is held: ``remote.connection`` hands out
a FleetStandInConnection, whose ``run()`` answers like fabric's ``Connection.run`` from the
same profile, with the same behaviours.

Profiles are JSON files beside this module (``fleet_profiles/<profile>.json``: the exact
command pyinfra sent -> exit code, stdout and stderr), recorded by
``fleet_profiles/capture.py`` from the real facts run on a real host through pyinfra's own
``@local`` connector, and ``testbed-converged`` by ``fleet_profiles/capture_up.py`` from
`plan` and `up` on a provisioned testbed VM. That one stands for a converged host under
another name: its ``{{name}}`` and ``{{address}}`` placeholders become each simulated
host's, its ``{{cluster_hosts_block}}`` line the fleet's own /etc/hosts lines, and its
``host_data`` goes into the simulated inventory (``write_inventory``).

What a simulated host was sent by put_file is kept (``SimulatedFleet.files``): a later
sha1sum of that path answers with the content's hash and its chown/chmod succeed, so the
files the controller writes per fleet (the training user's known_hosts of every node, a
new training key) converge on a first `up` as they would on a real host, and a second `up`
changes nothing. No other command that changes a host is answered.

Example::

    fleet = SimulatedFleet.spread(200, FleetShares(fail=0.05, hang=0.01))
    inv = fleet.write_inventory(tmp_path / "fleet.py", command_timeout_s=2)
    with simulated(fleet):
        cluster = inventory.load(inv)
        result = engine.gather_facts(list(cluster.nodes), HOST_FACTS)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import gevent
from pyinfra.api.exceptions import ConnectError
from pyinfra.connectors.base import BaseConnector
from pyinfra.connectors.util import CommandOutput, OutputLine

PROFILES = Path(__file__).parent / "fleet_profiles"
BEHAVIOURS = ("ok", "fail", "refuse", "hang", "blackhole", "freeze")
# ok: answers from the profile; fail: every command exits 1; refuse: the connection is
# refused at once; hang: connects, then no command ever answers (a wedged disk, an sshd
# that stops mid-session); blackhole: the connection attempt never answers, so it times
# out at the pass's CONNECT_TIMEOUT as paramiko's would; freeze: connects, then a command
# never answers and no command deadline ends the wait (a VM stopped after login: the SSH
# channel's open request itself goes unanswered, which pyinfra's _timeout does not bound).


BLOCK = "{{cluster_hosts_block}}"  # a converged profile's stand-in for the cluster's /etc/hosts lines
# pyinfra's Sha1File fact, and the chown/chmod files.put sends after an upload
SHA1_FACT = re.compile(r"^test -e (\S+) && \( sha1sum \1 ")
CONTENTS_FACT = re.compile(r"^\( test -e (\S+) && cat \1 \) \|\| echo ")  # pyinfra's FileContents
OWNER_MODE = re.compile(r"^(?:chown|chmod) (?:-R )?\S+ (\S+)$")


@cache
def profile_doc(name: str) -> dict[str, Any]:
    """A captured profile file: its source, commands and (converged profiles) host data."""
    doc: dict[str, Any] = json.loads((PROFILES / f"{name}.json").read_text())
    return doc


def profile(name: str) -> dict[str, dict[str, Any]]:
    """A captured profile: command -> {"exit": int, "stdout": [...], "stderr": [...]}."""
    commands: dict[str, dict[str, Any]] = profile_doc(name)["commands"]
    return commands


@dataclass(frozen=True)
class FleetShares:
    """Which share of a simulated fleet misbehaves, and how; the rest answer."""

    fail: float = 0.0  # share whose every command exits 1
    refuse: float = 0.0  # share that refuses connections
    hang: float = 0.0  # share that connects, then never answers a command
    blackhole: float = 0.0  # share whose connection attempt never answers
    freeze: float = 0.0  # share that connects, then never answers, deadline or not


@dataclass
class SimulatedFleet:
    """The simulated hosts: each one's behaviour, the latency of every command and
    connection, and the captured profile they all answer from."""

    behaviour: dict[str, str]  # host name -> one of BEHAVIOURS
    latency_s: float = 0.05  # seconds each command (and each connection) takes
    profile: str = "debian12-cpu"  # fleet_profiles/<profile>.json
    commands: dict[str, int] = field(default_factory=dict)  # host name -> commands answered
    busy: set[str] = field(default_factory=set)  # hosts connecting or running a command now
    most_busy: int = 0  # the most hosts busy at one moment (the pass's real parallelism)
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (host, path) -> what put_file wrote
    _address: dict[str, str] = field(default_factory=dict)  # addresses(), worked out once
    _block: list[str] = field(default_factory=list)  # the fleet's /etc/hosts lines, worked out once

    @contextmanager
    def working(self, host: str) -> Iterator[None]:
        """Count ``host`` as busy for the block (a connection or a command under way)."""
        self.busy.add(host)
        self.most_busy = max(self.most_busy, len(self.busy))
        try:
            yield
        finally:
            self.busy.discard(host)

    @classmethod
    def spread(cls, count: int, shares: FleetShares = FleetShares(), **kwargs: Any) -> SimulatedFleet:
        """``count`` hosts node-0000..., the misbehaving ones spread evenly through the
        fleet (so a test can name them) rather than drawn at random."""
        out = ["ok"] * count
        for behaviour in ("fail", "refuse", "hang", "blackhole", "freeze"):
            wanted = round(count * getattr(shares, behaviour))
            free = [i for i, b in enumerate(out) if b == "ok"]
            for k in range(wanted):
                out[free[(k * len(free)) // wanted]] = behaviour
        return cls({f"node-{i:04d}": b for i, b in enumerate(out)}, **kwargs)

    def named(self, behaviour: str) -> set[str]:
        return {name for name, b in self.behaviour.items() if b == behaviour}

    def addresses(self) -> dict[str, str]:
        """Host name -> the address its inventory entry gives it (SSH and cluster alike)."""
        if len(self._address) != len(self.behaviour):
            # from 10.0.0.1: the network's own address is no host's
            self._address = {
                name: f"10.{j // 65536 % 256}.{j // 256 % 256}.{j % 256}"
                for j, name in enumerate(self.behaviour, start=1)
            }
        return self._address

    def write_inventory(self, path: Path, **settings: Any) -> Path:
        """A real inventory file of these hosts (one address each), with these settings; with a
        converged profile, each host also gets the captured node's inventory data as its own
        (its data disks under its own name), on a cluster network that holds the fleet."""
        captured = profile_doc(self.profile).get("host_data")
        hosts = []
        for name, address in self.addresses().items():
            data = {"ssh_hostname": address}
            if captured is not None:
                data |= json.loads(self._expand(json.dumps(captured), name))
                data |= {"cluster_address": address, "cluster_cidr": "10.0.0.0/8"}
            hosts.append((name, data | settings))
        path.write_text(f"nodes = {hosts!r}\n")
        return path

    def answer(self, host: str, command: str) -> tuple[int, list[str], list[str]]:
        """(exit code, stdout lines, stderr lines) of a host that answers, after the latency."""
        with self.working(host):
            gevent.sleep(self.latency_s)
        self.commands[host] = self.commands.get(host, 0) + 1
        if self.behaviour.get(host) == "fail":
            return 1, [], ["fleet stand-in: this host fails every command"]
        written = self._on_written(host, command)
        if written is not None:
            return written
        doc = profile_doc(self.profile)
        if "host_data" not in doc:
            captured = doc["commands"].get(command)
            if captured is None:
                return 127, [], [f"fleet stand-in: no captured answer for: {command}"]
            return int(captured["exit"]), list(captured["stdout"]), list(captured["stderr"])
        address = self.addresses()[host]
        captured = doc["commands"].get(command.replace(address, "{{address}}").replace(host, "{{name}}"))
        if captured is None:
            return 127, [], [f"fleet stand-in: no captured answer for: {command}"]
        return int(captured["exit"]), self._lines(captured["stdout"], host), self._lines(captured["stderr"], host)

    def put(self, host: str, content: bytes, path: str) -> None:
        """What put_file wrote to ``path`` on ``host``."""
        self.files[(host, path)] = content

    def _on_written(self, host: str, command: str) -> tuple[int, list[str], list[str]] | None:
        """The answer about a file this simulation wrote, or None when the command is not one."""
        sha = SHA1_FACT.match(command)
        if sha and (host, sha[1]) in self.files:
            return 0, [f"{hashlib.sha1(self.files[(host, sha[1])]).hexdigest()}  {sha[1]}"], []
        contents = CONTENTS_FACT.match(command)
        if contents and (host, contents[1]) in self.files:
            return 0, self.files[(host, contents[1])].decode().splitlines(), []
        owner_mode = OWNER_MODE.match(command)
        if owner_mode and (host, owner_mode[1]) in self.files:
            return 0, [], []
        return None

    def _expand(self, text: str, host: str) -> str:
        return text.replace("{{address}}", self.addresses()[host]).replace("{{name}}", host)

    def _lines(self, lines: list[str], host: str) -> list[str]:
        out = []
        for line in lines:
            if line == BLOCK:
                out += self._hosts_block()
            elif "{{" in line:  # most captured lines name no host: kept as they are, cheaply
                out.append(self._expand(line, host))
            else:
                out.append(line)
        return out

    def _hosts_block(self) -> list[str]:
        if not self._block:
            form = profile_doc(self.profile)["hosts_line"]
            self._block = [form.replace("{{address}}", a).replace("{{name}}", n) for n, a in self.addresses().items()]
        return self._block


class FleetStandInConnector(BaseConnector):
    """Answers each command from the fleet's captured profile after its latency, or
    misbehaves as the host's behaviour says. Every wait is a gevent sleep, so a thousand
    hosts wait side by side in one process and a killed greenlet stops at once."""

    handles_execution = True
    fleet: ClassVar[SimulatedFleet] = SimulatedFleet({})  # set by simulated()

    @staticmethod
    def make_names_data(name: str | None = None) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
        raise NotImplementedError("the fleet stand-in is reached through plain host names")

    def connect(self) -> None:
        behaviour = self._behaviour()
        if behaviour == "refuse":
            raise ConnectError("Could not connect ([Errno 111] Connection refused) (fleet stand-in)")
        if behaviour == "blackhole":
            gevent.sleep(self.state.config.CONNECT_TIMEOUT)
            raise ConnectError("Could not connect (timed out) (fleet stand-in)")
        with self.fleet.working(self.host.name):
            gevent.sleep(self.fleet.latency_s)

    def run_shell_command(
        self, command: Any, print_output: bool = False, print_input: bool = False, **arguments: Any
    ) -> tuple[bool, CommandOutput]:
        text = command if isinstance(command, str) else command.get_masked_value()
        if self._behaviour() == "hang":
            return self._hang(arguments.get("_timeout"))
        if self._behaviour() == "freeze":
            return self._hang(None)
        code, stdout, stderr = self.fleet.answer(self.host.name, text)
        return code == 0, _output(stdout, stderr)

    def put_file(self, filename_or_io: Any, remote_filename: str, *args: Any, **kwargs: Any) -> bool:
        gevent.sleep(self.fleet.latency_s)
        if self._behaviour() != "ok":
            return False
        if hasattr(filename_or_io, "read"):
            filename_or_io.seek(0)
            content = filename_or_io.read()
        else:
            content = Path(filename_or_io).read_bytes()
        self.fleet.put(self.host.name, content.encode() if isinstance(content, str) else content, remote_filename)
        return True

    def get_file(self, *args: Any, **kwargs: Any) -> bool:
        gevent.sleep(self.fleet.latency_s)
        return self._behaviour() == "ok"

    def _behaviour(self) -> str:
        return self.fleet.behaviour.get(self.host.name, "refuse")

    @staticmethod
    def _hang(timeout: float | None) -> tuple[bool, CommandOutput]:
        """No answer: raise TimeoutError at the command's own _timeout, as pyinfra's ssh
        connector does (connectors.util.read_output_buffers); without one, sleep until
        the greenlet is killed."""
        if timeout is not None:
            gevent.sleep(timeout)
            raise TimeoutError()
        while True:
            gevent.sleep(3600)


class FleetStandInConnection:
    """What ``provision.remote.connection`` hands out while a fleet is simulated: the
    part of fabric's Connection that provision uses (``run``, ``close``)."""

    def __init__(self, fleet: SimulatedFleet, host: str, connect_timeout: float) -> None:
        self.fleet = fleet
        self.host = host  # the fleet's host name
        self.connect_timeout = connect_timeout  # seconds a blackholed host takes to time out

    def run(self, command: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """fabric's Connection.run with warn=True: a Result whatever the exit code; the
        connection's own errors raised as paramiko/socket would, a timeout as invoke's."""
        from invoke.exceptions import CommandTimedOut
        from invoke.runners import Result

        behaviour = self.fleet.behaviour.get(self.host, "refuse")
        if behaviour == "refuse":
            raise ConnectionRefusedError(111, "Connection refused (fleet stand-in)")
        if behaviour == "blackhole":
            gevent.sleep(self.connect_timeout)
            raise TimeoutError("timed out (fleet stand-in)")
        if behaviour == "hang":
            if timeout is None:
                while True:
                    gevent.sleep(3600)
            gevent.sleep(timeout)
            raise CommandTimedOut(Result(command=command, exited=-1), int(timeout))
        code, stdout, stderr = self.fleet.answer(self.host, command)
        return Result(stdout="".join(f"{s}\n" for s in stdout), stderr="".join(f"{s}\n" for s in stderr), exited=code)

    def close(self) -> None:
        pass


def _output(stdout: list[str], stderr: list[str]) -> CommandOutput:
    return CommandOutput([OutputLine("stdout", s) for s in stdout] + [OutputLine("stderr", s) for s in stderr])


@contextmanager
def simulated(fleet: SimulatedFleet) -> Iterator[SimulatedFleet]:
    """Every plain-named host pyinfra builds while this is held is one of ``fleet``'s."""
    from pyinfra.api import inventory

    from provision import remote
    from provision.inventory import Node

    by_address = {address: name for name, address in fleet.addresses().items()}

    def connection(target: Any, connect_timeout: int | None = None) -> FleetStandInConnection:
        name = target.name if isinstance(target, Node) else by_address.get(target.hostname, target.hostname)
        timeout = connect_timeout or (target.settings.connect_timeout_s if isinstance(target, Node) else 10)
        return FleetStandInConnection(fleet, name, timeout)

    connection_before = remote.connection
    remote.connection = connection  # type: ignore[assignment]
    all_before, exec_before = inventory.get_all_connectors, inventory.get_execution_connectors
    inventory.get_all_connectors = lambda: {**all_before(), "ssh": FleetStandInConnector}  # type: ignore[assignment]
    inventory.get_execution_connectors = lambda: {**exec_before(), "ssh": FleetStandInConnector}  # type: ignore[assignment]
    FleetStandInConnector.fleet = fleet
    try:
        yield fleet
    finally:
        inventory.get_all_connectors, inventory.get_execution_connectors = all_before, exec_before
        remote.connection = connection_before  # type: ignore[assignment]
        FleetStandInConnector.fleet = SimulatedFleet({})


def fact_only_step() -> Any:
    """A stand-in step of `up` for simulated fleets: it reads one captured fact (the OS) on
    each host and changes nothing, so a simulated host passes it exactly when it answers.
    The real steps' commands were never captured; what it serves to test and measure is the
    machinery around steps (rollout waves and stops, failures, every host reported),
    through the real pipeline and engine."""
    from pyinfra.api import deploy

    from provision import engine
    from provision.facts.host import HOST_FACTS

    fact, kwargs = HOST_FACTS["os"]

    @deploy("Stand-in: read the OS")
    def read_os() -> None:
        from pyinfra import host

        host.get_fact(fact, **kwargs)

    return engine.Step("standin", read_os, "reads one fact")
