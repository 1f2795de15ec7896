"""The typer app: thin, one sub-app per noun, no logic. Library errors become one line
per problem and the exit codes from docs/ARCHITECTURE.md (0 ok, 1 failed, 2 bad input)."""

from __future__ import annotations

import logging
import os
import sys

# pyinfra's CLI package monkey-patches threading with gevent when first imported (the
# inventory loader imports it). Patched after paramiko was imported, fabric's SSH threads
# deadlock (seen: `provision validate` hung in remote.run), so it is imported first.
import pyinfra_cli  # noqa: F401
import typer

from provision.cli.console import report_error
from provision.errors import ProvisionError

app = typer.Typer(
    name="provision",
    help="From a rack of new GPU servers to a proven training cluster: provision (up), accept (validate), train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: paragraphs are re-wrapped to the terminal
)


def _register() -> None:
    """Each noun's module adds its commands; importing here keeps startup in one place."""
    from provision.cli import demo, facts, inventory, status

    app.add_typer(inventory.app, name="inventory")
    app.command("facts")(facts.facts)
    app.command("demo")(demo.demo)
    from provision.cli import testbed

    app.add_typer(testbed.app, name="testbed")
    app.command("status")(status.status)
    from provision.cli import monitor

    app.command("monitor")(monitor.monitor)
    from provision.cli import backup

    app.add_typer(backup.app, name="backup")
    from provision.cli import up

    up.register(app)
    from provision.cli import validate

    validate.register(app)
    from provision.cli import train

    app.command("train")(train.train)
    from provision.cli import tune

    app.command("tune")(tune.tune)
    from provision.cli import run

    run.register(app)


def _quiet_paramiko() -> None:
    """paramiko's transport thread logs a traceback at ERROR for every host that answers
    TCP but not SSH, and with no handler Python prints it on stderr. The same failure
    reaches the summary as each host's reason (remote.run's CommandResult, pyinfra's
    connect error), so its log goes nowhere: no traceback ever reaches the screen."""
    log = logging.getLogger("paramiko")
    log.addHandler(logging.NullHandler())
    log.propagate = False


def main() -> None:
    _quiet_paramiko()
    _register()
    try:
        app()
    except ProvisionError as e:
        report_error(e)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    except Exception as e:  # a bug of ours: say so in one line; PROVISION_DEBUG shows the trace
        if os.environ.get("PROVISION_DEBUG"):
            raise
        report_error(
            ProvisionError(f"internal error: {type(e).__name__}: {e} (set PROVISION_DEBUG=1 for the traceback)")
        )
        sys.exit(1)
