"""The open-file limit before a pass over many hosts, on this process's real limits (set low
in a child process): the soft limit is raised as far as the hard one allows, and a hard
limit too low for the hosts is bad input, said before any host is contacted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from provision import openfiles


def _child(soft: int, hard: int, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
        """
    ) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_soft_limit_is_raised_to_what_the_hosts_need_when_the_hard_limit_allows():
    done = _child(
        128,
        4096,
        """
        from provision import openfiles
        print(openfiles.ensure(500), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(openfiles.needed(500))] * 2


def test_a_limit_already_high_enough_is_left_alone():
    done = _child(
        2048,
        4096,
        """
        from provision import openfiles
        print(openfiles.ensure(10), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        """,
    )
    assert done.stdout.split() == ["2048", "2048"]


def test_a_hard_limit_too_low_is_bad_input_naming_the_need_and_the_way_out(tmp_path):
    # 400 hosts on TEST-NET addresses: a command that contacted one would not exit 2 at once.
    hosts = [(f"n{i:03d}", {"ssh_hostname": f"10.9.{i // 200}.{i % 200 + 1}"}) for i in range(400)]
    inv = tmp_path / "inv.py"
    inv.write_text(f"nodes = {hosts!r}\n")
    done = _child(
        256,
        256,
        f"""
        import sys
        sys.argv = ["provision", "facts", {str(inv)!r}]
        from provision.cli import main
        main()
        """,
    )
    assert done.returncode == 2, done.stderr
    assert f"400 hosts at once need about {openfiles.needed(400)} open files" in " ".join(done.stderr.split())
    assert "--limit" in done.stderr
    assert "Traceback" not in done.stderr
