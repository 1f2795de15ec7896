"""pyinfra's callbacks, turned into HostResults and progress events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provision.engine.results import HostResult


def _collector_base() -> type:
    from pyinfra.api.state import BaseStateCallback

    return BaseStateCallback


class Collector(_collector_base()):  # type: ignore[misc]
    """pyinfra callback handler: records results and feeds the progress display."""

    def __init__(self, results: dict[str, HostResult], step: str, on_event: Callable[[str, str], None]):
        self.results, self.step, self.on_event = results, step, on_event
        self.finished: list[tuple[Any, str, bool]] = []  # (host, op, succeeded), settled after run_ops
        self.connect_errors: dict[str, str] = {}  # host -> last connection error, settled later

    def host_connect_error(self, state: Any, host: Any, error: Any) -> None:
        # Not final yet: pyinfra's reboot operation reconnects in a loop, and each early try
        # (the port forward answers before sshd does) lands here. settle_connections decides.
        self.connect_errors[host.name] = str(error)
        self.on_event(host.name, f"{self.step}: no SSH connection yet: {error}")

    def settle_connections(self, state: Any) -> None:
        """A host is unreachable if it is not connected once pyinfra is done trying."""
        for name, error in self.connect_errors.items():
            if not state.inventory.get_host(name).connected:
                result = self.results[name]
                result.reachable = False
                result.fail(self.step, f"unreachable: {error}")
                self.on_event(name, "unreachable")
        self.connect_errors.clear()

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:
        self.on_event(host.name, f"{self.step}: {op_name(state, op_hash)}")

    def operation_host_success(self, state: Any, host: Any, op_hash: str, retry_count: int = 0) -> None:
        self.finished.append((host, op_hash, True))

    def operation_host_error(self, state: Any, host: Any, op_hash: str, *args: Any) -> None:
        self.finished.append((host, op_hash, False))
        self.on_event(host.name, f"{self.step}: FAILED")

    def settle(self, state: Any) -> None:
        """Record changes and failures. pyinfra completes an operation's meta (output,
        commands) only after calling these callbacks, so it is read here, after run_ops."""
        self.settle_connections(state)
        for host, op_hash, success in self.finished:
            meta = state.get_op_data_for_host(host, op_hash).operation_meta
            if not success:
                self.results[host.name].fail(self.step, f"{op_name(state, op_hash)}: {_error_text(meta)}")
            elif meta.is_complete() and meta.did_change():
                self.results[host.name].count_change(self.step)
        self.finished.clear()


def op_name(state: Any, op_hash: str) -> str:
    names = state.get_op_meta(op_hash).names
    return ", ".join(sorted(names)) or op_hash[:8]


def _error_text(meta: Any) -> str:
    output = meta._combined_output  # pyinfra keeps no public accessor for a failed op's output
    if output is None:
        return "failed"
    lines = [line.line for line in output if line.line.strip()]
    return " / ".join(lines[-3:]) if lines else "command failed with no output"
