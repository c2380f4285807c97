"""The ``moe-patch`` command line: one click group, one error policy, one module per command.

Each ``cli/<command>.py`` parses options, calls ``moe_patch.commands.<command>`` with them
as keyword arguments and prints the report (:mod:`moe_patch.cli.render`); it reaches no
engine itself (``tests/unit/test_imports.py``).  Every failure reaches the user through
:class:`_Group`: one line on stderr and a documented exit code, never a traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

import click
import git

from .. import __version__, gitutil
from ..errors import (
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_LOCAL_IO,
    LOCAL_IO_WORDS,
    MoePatchError,
    is_local_io,
)
from . import (
    apply,
    checkout,
    clean,
    export,
    list_,
    pr,
    rebase,
    release,
    revert,
    status,
    tune,
    verify,
    wheel,
)

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _Group(click.Group):
    """The one error policy: every failure is one line on stderr and a documented exit code
    (a :class:`MoePatchError`'s own, 11 for a local read or write, 1 for a bug), never a
    traceback (``MOE_PATCH_DEBUG=1`` adds one, and all git said, before that line)."""

    def list_commands(self, ctx):
        return list(self.commands)  # the order of COMMANDS below, not alphabetical

    def invoke(self, ctx):
        gitutil.isolate_process()
        try:
            return super().invoke(ctx)
        except MoePatchError as exc:
            _fail(exc.message, exc.exit_code)
        except OSError as exc:  # disk full, read-only or unwritable: one line, not a traceback
            _details(exc)
            where = f" ({exc.filename})" if exc.filename else ""
            fix = "free space or fix permissions" if is_local_io(exc) else "check that path"
            _fail(
                f"{exc.strerror or exc}{where}; what this run wrote was rolled back: {fix}, "
                "then run the same command again",
                EXIT_LOCAL_IO,
            )
        except git.GitCommandError as exc:
            _details(exc)
            local = LOCAL_IO_WORDS.search(str(exc.stderr))
            _fail(_git_failure(exc), EXIT_LOCAL_IO if local else EXIT_INTERNAL)
        except KeyboardInterrupt:
            click.secho("moe-patch: interrupted; run the same command again to finish", err=True)
            sys.exit(130)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: one line, the traceback only on request
            _details(exc)
            click.secho(
                f"moe-patch: internal error: {type(exc).__name__}: {exc}; please report it with "
                "the command you ran (MOE_PATCH_DEBUG=1 shows the traceback)",
                err=True,
                fg="red",
            )
            sys.exit(EXIT_INTERNAL)


def debugging() -> bool:
    """``MOE_PATCH_DEBUG`` set to anything but empty, 0, false, no or off."""
    return os.environ.get("MOE_PATCH_DEBUG", "").strip().lower() not in (
        "",
        "0",
        "false",
        "no",
        "off",
    )


def _details(exc: BaseException) -> None:
    """With MOE_PATCH_DEBUG on: the traceback, and all git said, before the one line."""
    if debugging():
        traceback.print_exception(exc, file=sys.stderr)
        if isinstance(exc, git.GitCommandError):
            print(exc, file=sys.stderr)


def _fail(message: str, code: int) -> None:
    click.secho(f"moe-patch: error: {message}", err=True, fg="red")
    sys.exit(code)


def _git_failure(exc: git.GitCommandError) -> str:
    """One line for a git command that failed: which command and git's last words."""
    last = gitutil.last_words(str(exc.stderr or "")) or f"exit {exc.status}"
    verb = gitutil.verb(exc.command[1:] if isinstance(exc.command, list) else [])
    if LOCAL_IO_WORDS.search(str(exc.stderr)):
        return (
            f"git {verb} could not write ({last}); free space or fix permissions, "
            "then run the same command again"
        )
    return (
        f"git {verb} failed ({last}); please report it with the command you ran "
        "(MOE_PATCH_DEBUG=1 shows all git said)"
    )


@click.group(cls=_Group, context_settings=CONTEXT, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="moe-patch")
def main():
    """Apply, verify and ship the moe-patch series for vLLM's FP8 fused-MoE path."""


# The commands, in the order --help lists them: users first, then maintainers.
COMMANDS = (
    apply.command,
    list_.command,
    wheel.command,
    tune.command,
    status.command,
    revert.command,
    clean.command,
    verify.command,
    rebase.command,
    checkout.command,
    export.command,
    pr.command,
    release.command,
)
for _command in COMMANDS:
    main.add_command(_command)
