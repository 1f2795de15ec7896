"""Several facts in one command (engine/fact_batch.py): the composed command and how its
output is read back, part by part, with each fact's own meaning kept."""

from __future__ import annotations

import pytest
from pyinfra.api import FactBase

from provision.engine import fact_batch
from provision.facts.system import Memory, Os


class StandInNeedsTool(FactBase):
    def requires_command(self) -> str:
        return "sometool"

    def command(self) -> str:
        return "sometool --list"

    def process(self, output):
        return output


class StandInTakesArgs(FactBase):
    def command(self, path: str) -> str:
        return f"stat -c %s {path}"

    def process(self, output):
        return int(output[0])


WANTED = {"os": (Os, {}), "tool": (StandInNeedsTool, {}), "size": (StandInTakesArgs, {"path": "/etc/hosts"})}
M = fact_batch.MARK


def test_the_command_runs_each_fact_between_markers_with_its_exit_status():
    cls = fact_batch.batch_fact(WANTED)
    command = cls().command()
    assert command.startswith(f"echo '{M} begin os'; ( cat /etc/os-release;")
    assert f"echo '{M} end os' $?" in command
    # A required command is checked as pyinfra checks it, per part.
    assert f"if command -v sometool >/dev/null 2>&1; then ( sometool --list ); echo '{M} end tool' $?; else" in command
    assert f"echo '{M} missing tool sometool'; fi" in command
    assert "( stat -c %s /etc/hosts )" in command  # a fact's arguments reach its command


def test_each_distinct_batch_is_its_own_pyinfra_fact():
    a, b = fact_batch.batch_fact(WANTED), fact_batch.batch_fact({"os": (Os, {})})
    assert a.name != b.name
    assert fact_batch.batch_fact(WANTED).name == a.name  # the same facts: the same name


OS_LINES = [
    "ID=debian",
    'VERSION_ID="12"',
    'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
    "---",
    "6.1.0",
    "x86_64",
    "n1",
]


def test_each_part_goes_to_its_own_facts_process():
    lines = [f"{M} begin os", *OS_LINES, f"{M} end os 0", f"{M} begin memory", "MemTotal: 1024 kB", f"{M} end memory 0"]
    got = fact_batch.answers({"os": (Os, {}), "memory": (Memory, {})}, lines)
    assert got["os"].error == ""
    assert got["os"].value.version_id == "12"
    assert got["memory"].value == 1024 * 1024


def test_a_missing_tool_a_failed_command_and_an_unfinished_part_each_fail_their_fact_alone():
    wanted = {"os": (Os, {}), "tool": (StandInNeedsTool, {}), "size": (StandInTakesArgs, {"path": "/x"})}
    lines = [f"{M} begin os", *OS_LINES, f"{M} end os 0", f"{M} begin tool", f"{M} missing tool sometool"]
    lines += [f"{M} begin size", "stat: cannot stat '/x'", f"{M} end size 1"]
    got = fact_batch.answers(wanted, lines)
    assert got["os"].error == ""
    assert got["tool"].error == "fact tool: MissingCommandError: sometool"
    assert got["size"].error == "fact size: the command failed on the host"
    cut = fact_batch.answers({"os": (Os, {})}, [f"{M} begin os", *OS_LINES[:2]])
    assert cut["os"].error == "fact os: the command did not finish on the host"


def test_output_a_fact_cannot_read_is_that_facts_error():
    lines = [f"{M} begin size", "not a number", f"{M} end size 0"]
    (answer,) = fact_batch.answers({"size": (StandInTakesArgs, {"path": "/x"})}, lines).values()
    assert answer.error.startswith("fact size: ValueError: invalid literal for int()")


def test_no_output_is_the_facts_default_and_none_is_a_failure():
    lines = [f"{M} begin os", f"{M} end os 0"]
    (answer,) = fact_batch.answers({"os": (Os, {})}, lines).values()
    assert answer.error == "fact os: the command failed on the host"  # Os has no default value


@pytest.mark.parametrize("name", ["two words", "a;b", "", "os\n"])
def test_a_section_name_must_be_an_identifier(name):
    with pytest.raises(ValueError, match="identifier"):
        fact_batch.batch_fact({name: (Os, {})})
