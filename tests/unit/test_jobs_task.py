"""The task file (jobs/task.py): SkyPilot's keys where they overlap, every problem named by
file and key, nothing started on bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.errors import InputError
from provision.jobs import task

# SkyPilot's own minimal distributed example (docs: "Distributed Multi-Node Jobs"), with the
# accelerators it asks for.
SKYPILOT_DISTRIBUTED = """\
name: minimal

resources:
  accelerators: A100:8

num_nodes: 2

setup: |
  echo "Running setup."

run: |
  num_nodes=`echo "$SKYPILOT_NODE_IPS" | wc -l`
  master_addr=`echo "$SKYPILOT_NODE_IPS" | head -n1`
  echo "Worker $SKYPILOT_NODE_RANK of $num_nodes, master $master_addr."
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(InputError) as e:
        task.load(_write(tmp_path, text))
    return [str(p) for p in e.value.problems]


def test_skypilots_distributed_example_loads_unchanged(tmp_path):
    t = task.load(_write(tmp_path, SKYPILOT_DISTRIBUTED))
    assert (t.name, t.num_nodes, t.gpus_per_node, t.accelerator) == ("minimal", 2, 8, "A100")
    assert t.setup == 'echo "Running setup."\n'
    assert t.run.startswith("num_nodes=`echo")


def test_accelerators_in_each_of_skypilots_forms():
    for value, expected in (("H100:8", 8), ("H100", 1), ({"L40S": 4}, 4)):
        t = task.from_mapping({"run": "x", "resources": {"accelerators": value}}, "t", Path("/"))
        assert t.gpus_per_node == expected


def test_a_workdir_and_file_mounts_are_taken_from_the_task_files_directory(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "data.csv").write_text("a,b\n")
    t = task.load(_write(tmp_path, "workdir: code\nfile_mounts:\n  /shared/datasets/d.csv: data.csv\nrun: x\n"))
    assert t.workdir == (tmp_path / "code").resolve()
    assert t.file_mounts == (("/shared/datasets/d.csv", (tmp_path / "data.csv").resolve()),)


def test_every_problem_is_named_by_file_and_key_at_once(tmp_path):
    said = _problems(
        tmp_path,
        "name: 'bad name'\nnum_nodes: 0\nresources:\n  cloud: aws\n  accelerators: H100:x\n"
        "service: {}\nfoo: 1\nenvs:\n  MASTER_ADDR: x\n  LD_PRELOAD: /x.so\n  'bad key': 1\n"
        "workdir: missing\nfile_mounts:\n  relative/path: x\n  /a/../b: x\n  /c: s3://bucket\n"
        "time_limit: soon\npip: 3\n",
    )
    where = str(tmp_path / "task.yaml")
    for key in (
        "name",
        "num_nodes",
        "resources.cloud",
        "resources.accelerators",
        "service",
        "foo",
        "envs.MASTER_ADDR",
        "envs.LD_PRELOAD",
        "envs.bad key",
        "workdir",
        "file_mounts.relative/path",
        "file_mounts./a/../b",
        "file_mounts./c",
        "time_limit",
        "pip",
        "run",
    ):
        assert [s for s in said if s.startswith(f"{where}: {key}:")], key


def test_cloud_keys_say_why_they_are_not_supported(tmp_path):
    (said,) = _problems(tmp_path, "run: x\nstorage_mounts: {}\n")
    assert "not supported" in said
    assert "share" in said


@pytest.mark.parametrize(
    "text",
    ["", "- a list\n", "run: [unclosed\n", "\x00", "run: x\nnum_nodes: true\n", "run: x\nnum_nodes: 1.5\n"],
)
def test_what_is_not_a_task_is_one_line_not_a_traceback(tmp_path, text):
    assert _problems(tmp_path, text)


def test_a_task_file_that_is_not_a_regular_file_is_refused(tmp_path):
    with pytest.raises(InputError, match="no such regular file"):
        task.load(tmp_path)


def test_time_limit_in_seconds_or_slurms_form():
    def limit(value):
        return task.from_mapping({"run": "x", "time_limit": value}, "t", Path("/")).time_limit_s

    assert limit(90) == 90
    assert limit("01:30:00") == 5400
    assert limit("2-00:00:00") == 2 * 86400


def test_include_syncs_what_is_left_out_by_default_and_must_stay_inside(tmp_path):
    t = task.from_mapping({"run": "x", "include": [".git", "data/big.bin"]}, "t", tmp_path)
    assert t.include == (".git", "data/big.bin")
    for bad in (["/etc"], ["../x"], "x", [3]):
        with pytest.raises(InputError, match="include"):
            task.from_mapping({"run": "x", "include": bad}, "t", tmp_path)


def test_flags_beside_a_task_file_win_and_add_to_its_envs(tmp_path):
    path = _write(tmp_path, "run: x\nnum_nodes: 2\nenvs:\n  A: 1\n  B: 2\n")
    t = task.load(path, {"num_nodes": 1, "envs": {"B": "3", "C": "4"}})
    assert t.num_nodes == 1
    assert dict(t.envs) == {"A": "1", "B": "3", "C": "4"}
    with pytest.raises(InputError, match=r"envs\.MASTER_PORT"):
        task.load(path, {"envs": {"MASTER_PORT": "1"}})  # a flag is checked as the file's keys are
