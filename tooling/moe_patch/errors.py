"""The product's error type and its exit codes.

Every failure a user can cause is raised as a :class:`MoePatchError` carrying a
one-line message that says what is wrong and what to do; the CLI prints it and
exits with the error's code.  Exit codes are part of the interface (see
``moe-patch --help``).
"""

from __future__ import annotations

import errno
import re

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug in moe-patch: one line (MOE_PATCH_DEBUG=1 shows the traceback)
EXIT_USAGE = 2  # bad input: unknown version, bad option, bad source tree
EXIT_PATCH_FAILED = 3  # a patch did not apply; the tree is at the last good commit
EXIT_NETWORK = 4  # the package index could not be read or a download failed
EXIT_INTEGRITY = 5  # hash mismatch, corrupt or hostile archive or patch
EXIT_BUSY = 6  # another moe-patch holds the lock on the cache entry or target
EXIT_STATE = 7  # the target is not in a state we may touch (dirty, foreign commits)
EXIT_VERIFY_FAILED = 8  # verify: at least one check failed (the report names it)
EXIT_CONFLICT = 9  # rebase stopped at a conflict: resolve, then --continue / --skip / --abort
EXIT_EXPORT_STALE = 10  # export --check: the patch files differ from the commits
EXIT_LOCAL_IO = 11  # a local read or write failed: disk full, permissions, read-only filesystem

EXIT_MEANINGS = {
    EXIT_OK: "success",
    EXIT_INTERNAL: "internal error: a bug in moe-patch (please report it; MOE_PATCH_DEBUG=1 "
    "shows more)",
    EXIT_USAGE: "bad input (unknown version, option, source tree, missing program or git)",
    EXIT_PATCH_FAILED: "a patch failed to apply (the tree is left at the last good commit)",
    EXIT_NETWORK: "the package index or a download could not be reached",
    EXIT_INTEGRITY: "integrity error (hash mismatch, corrupt or hostile archive or patch)",
    EXIT_BUSY: "busy: another moe-patch run holds the lock",
    EXIT_STATE: "the target is not in a state moe-patch may change (dirty, foreign commits)",
    EXIT_VERIFY_FAILED: "a check failed (the report names it)",
    EXIT_CONFLICT: "rebase stopped at a conflict (resolve, then rebase --continue, --skip or "
    "--abort)",
    EXIT_EXPORT_STALE: "export --check: the series files are not what the commits export to",
    EXIT_LOCAL_IO: "a local read or write failed (disk full, permissions, read-only "
    "filesystem); what the run wrote was rolled back",
}


# What a command that resolves, downloads and caches a release and writes a tree can give.
FETCHING = frozenset({EXIT_USAGE, EXIT_NETWORK, EXIT_INTEGRITY, EXIT_BUSY, EXIT_LOCAL_IO})


def _codes_table(codes) -> list[str]:
    # A "\b" line makes click print the paragraph after it as written instead of re-wrapping.
    return ["\b", "Exit codes:"] + [f" {code:>2}  {EXIT_MEANINGS[code]}" for code in sorted(codes)]


EXIT_CODES_HELP = "\n".join(_codes_table(EXIT_MEANINGS)) + "\n"


def command_epilog(examples: list[str], codes: set[int]) -> str:
    """A command's ``--help`` epilog: examples, then the exit codes that command can give
    (0 and 1, a bug, always)."""
    lines = ["\b", "Examples:", *(f"  {example}" for example in examples), ""]
    return "\n".join(lines + _codes_table({EXIT_OK, EXIT_INTERNAL, *codes})) + "\n"


# A failed local read or write, in git's and pip's words and as errno values: exit 11, not the
# error of the step that happened to be writing (an archive "not readable", a pip "network"
# failure).
DISK_FULL_WORDS = re.compile(r"No space left on device|Disk quota exceeded|Out of diskspace")
LOCAL_IO_WORDS = re.compile(rf"{DISK_FULL_WORDS.pattern}|Read-only file system|Permission denied")
LOCAL_IO_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def is_local_io(exc: OSError) -> bool:
    return exc.errno in LOCAL_IO_ERRNOS


GIT_MISSING = (
    "git is not installed or not on PATH; install git (2.32 or newer) or put it on PATH, "
    "then run the same command again"
)


class MoePatchError(Exception):
    """A failure with a one-line, user-facing message and an exit code."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        return str(self.args[0])


class UsageError(MoePatchError):
    exit_code = EXIT_USAGE


class PatchFailed(MoePatchError):
    exit_code = EXIT_PATCH_FAILED


class NetworkError(MoePatchError):
    exit_code = EXIT_NETWORK


class IntegrityError(MoePatchError):
    exit_code = EXIT_INTEGRITY


class BusyError(MoePatchError):
    exit_code = EXIT_BUSY


class StateError(MoePatchError):
    exit_code = EXIT_STATE


class LocalIOError(MoePatchError):
    """A file moe-patch must read or write cannot be: free space or fix permissions."""

    exit_code = EXIT_LOCAL_IO


class RebaseStopped(MoePatchError):
    exit_code = EXIT_CONFLICT


class PatchFormatError(IntegrityError):
    """A patch file that cannot be parsed or that is unsafe to apply."""
