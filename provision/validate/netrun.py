"""Controller-side benchmarks between nodes: iperf3 link rounds and the multi-node
all-reduce (torchrun on every host). Commands only; the scheduling and the blame are
pure logic in rounds.py.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.validate import parsers, rounds
from provision.validate.rounds import PairResult

IPERF_PORT = 5301  # + round index, so a server left from a failed round never blocks the next
IPERF_STREAMS = 4
MISSING_IPERF = "not run: iperf3 missing (run the `up` step base)"
ALLREDUCE_PORT_OFFSET = 11  # master port = train_master_port + this, clear of a running trainer
ALLREDUCE_TIMEOUT_S = 300

Progress = Callable[[str, str], None]


def server_command(address: str, port: int, seconds: int) -> str:
    """One-shot iperf3 server in the background, bounded by timeout; prints its pid."""
    return (
        f"command -v iperf3 >/dev/null || {{ echo missing; exit 127; }}; "
        f"nohup timeout {seconds + 30} iperf3 -s -1 -B {address} -p {port} "
        f"</dev/null >/dev/null 2>&1 & echo $!"
    )


def client_command(address: str, server: str, port: int, seconds: int) -> str:
    """iperf3 client with parallel streams and JSON output; retried while the server starts."""
    run = f"iperf3 -c {server} -B {address} -p {port} -P {IPERF_STREAMS} -t {seconds} -J --connect-timeout 2000"
    return (
        f"for i in 1 2 3 4 5 6 7 8 9 10; do out=$(timeout {seconds + 20} {run}) && break; "
        f"sleep 0.5; done; printf '%s\\n' \"$out\""
    )


def measure_pair(a: Node, b: Node, port: int, seconds: int, round_index: int) -> PairResult:
    """a sends to b over the cluster network."""
    server = remote.run(b, server_command(b.cluster_address, port, seconds), timeout=30)
    if server.exited == 127 or server.stdout.strip() == "missing":
        return PairResult(a.name, b.name, None, round_index, MISSING_IPERF)
    if not server.ok:
        return PairResult(a.name, b.name, None, round_index, f"server: {server.stderr.strip()}")
    pid = server.stdout.strip().splitlines()[-1]
    try:
        client = remote.run(
            a,
            "command -v iperf3 >/dev/null || exit 127; "
            + client_command(a.cluster_address, b.cluster_address, port, seconds),
            timeout=seconds * 10 + 60,
        )
        if client.exited == 127:
            return PairResult(a.name, b.name, None, round_index, MISSING_IPERF)
        result = parsers.iperf3(client.stdout)
        return PairResult(a.name, b.name, result.bits_per_second / 1e9, round_index)
    except parsers.ParseError as e:
        return PairResult(a.name, b.name, None, round_index, str(e))
    finally:
        if pid.isdigit():  # the server we started, by its pid
            remote.run(b, f"kill {pid} 2>/dev/null; true", timeout=30)


def links(
    nodes: list[Node], mode: str, seconds: int, say: Progress, peers: int = rounds.FULL_PEERS
) -> tuple[dict[str, tuple[float | None, str, str]], dict[str, Any]]:
    """Link rounds, then bisection of slow pairs. Per node: (Gbit/s, not-run reason, detail)."""
    by_name = {n.name: n for n in nodes}
    names = [n.name for n in nodes]
    schedule, tested = (rounds.ring_rounds(names), "ring") if mode == "quick" else rounds.full_rounds(names, peers)
    results: list[PairResult] = []
    for k, pairs in enumerate(schedule):
        for a, b in pairs:
            say(a, f"link round {k + 1}/{len(schedule)}: -> {b}")
        results += _round(pairs, by_name, IPERF_PORT + k, seconds, k)
    usable = [r for r in results if r.error != MISSING_IPERF]
    slow = rounds.slow_pairs(usable)
    blamed, extra = rounds.bisect(
        slow,
        usable,
        names,
        lambda x, c: measure_pair(by_name[x], by_name[c], IPERF_PORT + len(schedule), seconds, -1).gbits,
    )
    values = rounds.node_values(usable + extra, names, blamed)
    out = {}
    for name in names:
        value, detail = values.get(name, (None, ""))
        missing = any(r.error == MISSING_IPERF and name in (r.a, r.b) for r in results)
        why = (
            MISSING_IPERF
            if value is None and missing
            else ("" if value is not None else "not run: every link test failed")
        )
        if name in blamed:
            detail = f"{blamed[name]}; {detail}"
        out[name] = (value, why, detail)
    pair_rows = [{"a": r.a, "b": r.b, "gbits": r.gbits, "round": r.round, "error": r.error} for r in results + extra]
    return out, {"pairs": pair_rows, "blamed": blamed, "rounds": len(schedule), "tested": tested}


def _round(pairs: list[tuple[str, str]], by_name: dict[str, Node], port: int, seconds: int, k: int) -> list[PairResult]:
    """All pairs of a round at once: no node is in two of them."""
    if not pairs:
        return []
    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        futures = [pool.submit(measure_pair, by_name[a], by_name[b], port, seconds, k) for a, b in pairs]
        return [f.result() for f in futures]


# --- all-reduce over all nodes --------------------------------------------------------------


def private_dir(token: str) -> str:
    """The all-reduce's directory on a node (pid file and log), made with mode 0700 by the
    run itself; ``token`` is fresh per all-reduce, so no one can make it first."""
    return f"/tmp/provision-allreduce-{token}"


def torchrun_command(node: Node, rank: int, nnodes: int, master: Node, agent_path: str, gpus: int, token: str) -> str:
    """One host's torchrun, in its own session so teardown can kill the whole group by pid.

    Its pid file and log live in a directory that ``mkdir`` makes with mode 0700 (it fails
    when the name exists, whoever made it), and torchrun's chain carries
    PROVISION_ALLREDUCE=<token> in its environment, which teardown checks before any signal."""
    backend, nproc, mb = ("nccl", gpus, 1024) if gpus else ("gloo", 1, 64)
    python = shlex.quote(f"{node.settings.venv_path}/bin/python")
    addr = node.cluster_address
    d = shlex.quote(private_dir(token))
    iface = node.settings.cluster_interface or ""
    return (
        f'D={d}; umask 077; mkdir -m 0700 -- "$D" || exit 1; '
        f'IF={shlex.quote(iface)}; [ -n "$IF" ] || IF=$(ip -o -4 addr show | '
        f"awk '$4 ~ /^{addr.replace('.', '[.]')}\\// {{print $2; exit}}'); "
        "export GLOO_SOCKET_IFNAME=$IF NCCL_SOCKET_IFNAME=$IF; "
        f'P={python}; [ -x "$P" ] || P=python3; '
        f"PROVISION_ALLREDUCE={shlex.quote(token)} "
        f'setsid timeout {ALLREDUCE_TIMEOUT_S} "$P" -m torch.distributed.run --nnodes {nnodes} '
        f"--node-rank {rank} --nproc-per-node {nproc} --master-addr {shlex.quote(master.cluster_address)} "
        f"--master-port {master.settings.train_master_port + ALLREDUCE_PORT_OFFSET} "
        f"{shlex.quote(agent_path)} allreduce-worker --mb {mb} --backend {backend} "
        '> "$D/log" 2>&1 & echo $! > "$D/pid"; wait $!; rc=$?; cat "$D/log"; rm -rf -- "$D"; '
        "exit $rc"
    )


def teardown_command(token: str) -> str:
    """Kill the all-reduce's process group by the pid it wrote, only when the directory is
    ours (made by this user, not a link), the pid is a number above 1 and that process
    carries the run's marker in its environment."""
    d, marker = shlex.quote(private_dir(token)), shlex.quote(f"PROVISION_ALLREDUCE={token}")
    return (
        f'D={d}; if [ -d "$D" ] && [ ! -L "$D" ] && [ -O "$D" ]; then '
        'p=$(head -c 20 "$D/pid" 2>/dev/null); case "$p" in ""|*[!0-9]*) p=0;; esac; '
        f'if [ "$p" -gt 1 ] && tr "\\0" "\\n" < "/proc/$p/environ" 2>/dev/null | grep -qxF -- {marker}; '
        'then kill -s TERM -- "-$p" 2>/dev/null; fi; rm -rf -- "$D"; fi; true'
    )


def allreduce(
    nodes: list[Node], paths: dict[str, str], gpus: dict[str, int], say: Progress
) -> tuple[float | None, str, dict[str, Any]]:
    """busbw of one large all-reduce over every node: (GB/s, not-run reason, detail)."""
    token = secrets.token_hex(8)  # not the agent's token: that one is seen in `ps` first
    per_node_gpus = min(gpus.values())  # NCCL needs the same local world size everywhere
    for n in nodes:
        say(n.name, "all-reduce across nodes")

    def one(node: Node) -> remote.CommandResult:
        cmd = torchrun_command(
            node, nodes.index(node), len(nodes), nodes[0], paths[node.name], per_node_gpus, f"{node.name}-{token}"
        )
        return remote.run(node, cmd, timeout=ALLREDUCE_TIMEOUT_S + 60)

    results = remote.on_all(nodes, one, together=True)  # one rendezvous: every node at once
    if not all(r.ok for r in results.values()):
        _teardown(nodes, token)
        bad = [f"{name}: {_failed(r)}" for name, r in results.items() if not r.ok]
        return None, "not run: all-reduce failed: " + " | ".join(bad), {}
    for line in results[nodes[0].name].stdout.splitlines():
        if line.startswith('{"allreduce"'):
            detail = json.loads(line)["allreduce"]
            return float(detail["busbw_gbs"]), "", detail
    return None, "not run: rank 0 printed no result", {}


def _failed(r: remote.CommandResult) -> str:
    """How one host's torchrun ended, in words: exit 124 is timeout(1)'s."""
    tail = (r.stdout + r.stderr).strip()[-200:]
    if r.exited == remote.TIMED_OUT:
        return f"timed out after {ALLREDUCE_TIMEOUT_S} s (all-reduce across nodes): {tail}"
    return f"exit {r.exited}: {tail}"


def _teardown(nodes: list[Node], token: str) -> None:
    """Kill what is left of the torchrun sessions we started, by the pid each wrote."""

    def kill(node: Node) -> remote.CommandResult:
        return remote.run(node, teardown_command(f"{node.name}-{token}"), timeout=30)

    remote.on_all(nodes, kill)
