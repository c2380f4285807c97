"""The one way moe-patch runs git: every command, reads included, under one configuration.

What moe-patch writes and checks (patch files, commits, ``export --check``, ``verify``) must
be the same bytes on every machine, so no setting of the user's may change them: git runs
without the user's global and system configuration (``GIT_CONFIG_GLOBAL``, ``HOME`` and
``GIT_CONFIG_NOSYSTEM``, which also covers git older than 2.32), without the caller's
``GIT_*`` variables (a hook's ``GIT_DIR``, ``GIT_DIFF_OPTS``, ``GIT_CONFIG_PARAMETERS``,
``GIT_NAMESPACE`` ...), and with :data:`PINNED`: git's own defaults for every setting that
changes the bytes of ``diff``, ``format-patch``, ``apply``, ``am``, ``cherry-pick`` or a
commit, given on the command line so that they also win over a tree's own ``.git/config``.

Three things of the user's are kept where they are needed: ``safe.directory`` (a checkout
owned by another user that they trust), their identity (:func:`user_setting`, for the
sign-off ``export`` and ``pr`` write), and, for a clone over the network (``--git URL``),
their transport configuration (credentials, proxies, ``url.*.insteadOf``, ssh).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import git

from .errors import DISK_FULL_WORDS, GIT_MISSING, LocalIOError, StateError, UsageError

# git's defaults for everything that changes bytes moe-patch writes or compares.
PINNED = (
    # What a patch looks like (diff, format-patch, range-diff).
    ("diff.noprefix", "false"),
    ("diff.mnemonicPrefix", "false"),
    ("diff.srcPrefix", "a/"),
    ("diff.dstPrefix", "b/"),
    ("diff.relative", "false"),
    ("diff.context", "3"),
    ("diff.interHunkContext", "0"),
    ("diff.algorithm", "myers"),
    ("diff.indentHeuristic", "true"),
    ("diff.renames", "true"),
    ("diff.renameLimit", "1000"),
    ("diff.suppressBlankEmpty", "false"),
    ("diff.orderFile", os.devnull),
    ("diff.submodule", "short"),
    ("diff.colorMoved", "false"),
    ("color.ui", "false"),
    ("color.diff", "false"),
    ("core.quotePath", "true"),
    ("core.pager", "cat"),
    ("format.noprefix", "false"),
    ("format.signOff", "false"),
    ("format.coverLetter", "false"),
    ("format.thread", "false"),
    ("format.numbered", "false"),
    ("format.useAutoBase", "false"),
    ("format.notes", "false"),
    ("format.from", "false"),
    ("format.forceInBodyFrom", "false"),
    ("format.encodeEmailHeaders", "true"),
    ("format.mboxrd", "false"),
    ("format.subjectPrefix", "PATCH"),
    ("i18n.commitEncoding", "UTF-8"),
    ("i18n.logOutputEncoding", "UTF-8"),
    ("log.showSignature", "false"),
    ("log.mailmap", "false"),
    # How a patch applies (apply, am, cherry-pick).
    ("apply.whitespace", "nowarn"),
    ("apply.ignoreWhitespace", "no"),
    ("am.threeWay", "false"),
    ("am.messageId", "false"),
    ("mailinfo.scissors", "false"),
    ("merge.conflictStyle", "merge"),
    ("merge.renormalize", "false"),
    ("merge.renames", "true"),
    ("merge.directoryRenames", "conflict"),
    ("rerere.enabled", "false"),
    ("rerere.autoUpdate", "false"),
    # What is committed and checked out: the user's hooks, signing, attributes and
    # line-ending conversion must neither fail moe-patch's commits nor change what they hold.
    ("core.autocrlf", "false"),
    ("core.eol", "lf"),
    ("core.safecrlf", "false"),
    ("core.attributesFile", os.devnull),
    ("core.excludesFile", os.devnull),
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("commit.gpgSign", "false"),
    ("commit.cleanup", "default"),
    ("tag.gpgSign", "false"),
    ("tag.forceSignAnnotated", "false"),
    ("user.useConfigOnly", "false"),
    ("init.templateDir", ""),
    ("init.defaultBranch", "master"),
    ("clone.defaultRemoteName", "origin"),
    ("submodule.recurse", "false"),
    # No automatic gc / maintenance after our commands: git would detach it into the
    # background, where it repacks a tree moe-patch may be removing (rebase --abort failed
    # with ENOENT that way) and spends the user's CPU after we have returned.
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
)

# Set for every command; the caller's GIT_* variables are dropped first.
_FIXED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": ":",
    "LC_ALL": "C",
}

# Variables that point git at another repository, index or object store (git's own list,
# ``git rev-parse --local-env-vars``).  A git hook or wrapper sets them; they must not steer
# the commands moe-patch runs in the trees it names, nor GitPython's.
_REPOSITORY_VARIABLES = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_CONFIG",
    "GIT_OBJECT_DIRECTORY",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_IMPLICIT_WORK_TREE",
    "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_REPLACE_REF_BASE",
    "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX",
    "GIT_SHALLOW_FILE",
    "GIT_COMMON_DIR",
)

# What a clone over the network may need of the user's: where their configuration is
# (credential helpers, proxies, url.*.insteadOf live there) and the transport variables.
_TRANSPORT_VARIABLES = (
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_SSL_NO_VERIFY",
    "GIT_SSL_CERT",
    "GIT_SSL_KEY",
    "GIT_HTTP_USER_AGENT",
    "GIT_HTTP_LOW_SPEED_LIMIT",
    "GIT_HTTP_LOW_SPEED_TIME",
    "GIT_PROXY_COMMAND",
    "GIT_PROXY_SSL_CERT",
    "GIT_PROXY_SSL_KEY",
    "GIT_PROXY_SSL_CAINFO",
    "GIT_ALLOW_PROTOCOL",
)

# git commands that write: a failure of one on a full disk is the disk's, whatever git said.
_WRITING = frozenset(
    "add am apply branch checkout cherry-pick clone commit commit-tree config fetch init "
    "read-tree remote repack reset switch tag update-ref worktree write-tree".split()
)
_FULL_BELOW = 1 << 20  # bytes free under which a failed write is taken as a full disk


def _is_callers(key: str) -> bool:
    """A variable of the caller's that git reads (GitPython's own GIT_PYTHON_* stay)."""
    return key.startswith("GIT_") and not key.startswith("GIT_PYTHON_")


def without_repository_variables(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the variables that would make git work on another repository."""
    return {key: value for key, value in env.items() if key not in _REPOSITORY_VARIABLES}


def isolate_process() -> None:
    """Drop those variables from this process too: GitPython and child processes inherit it."""
    for key in _REPOSITORY_VARIABLES:
        os.environ.pop(key, None)


def _with_config(env: dict[str, str], pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Add ``pairs`` through GIT_CONFIG_COUNT/KEY/VALUE, after any already in ``env``."""
    count = int(env.get("GIT_CONFIG_COUNT") or 0)
    for key, value in pairs:
        env[f"GIT_CONFIG_KEY_{count}"] = key
        env[f"GIT_CONFIG_VALUE_{count}"] = value
        count += 1
    env["GIT_CONFIG_COUNT"] = str(count)
    return env


def environment(env: Mapping[str, str] | None = None, transport: bool = False) -> dict[str, str]:
    """The environment of a git command of moe-patch: this process's, less the caller's git
    variables and configuration, plus ``env`` (the command's own GIT_DIR, identity ...)."""
    full = {key: value for key, value in os.environ.items() if not _is_callers(key)}
    full.update(_FIXED_ENV)
    if transport:  # the system configuration may hold the credential helper: theirs, too
        full.pop("GIT_CONFIG_NOSYSTEM")
        full.update({k: v for k, v in os.environ.items() if k in _TRANSPORT_VARIABLES})
    else:
        full.pop("XDG_CONFIG_HOME", None)
        full.update(HOME=os.devnull, GIT_CONFIG_GLOBAL=os.devnull)
    full.update(env or {})
    return _with_config(full, PINNED + _safe_directories())


def run(
    cwd: Path | str,
    *args: str,
    env: Mapping[str, str] | None = None,
    transport: bool = False,
    strip_newline_in_stdout: bool = True,
    stdout_as_string: bool = True,
    with_extended_output: bool = False,
    istream=None,
):
    """``git ARGS`` in ``cwd`` under :func:`environment`, reading ``istream`` (a file) if
    given: its output (one final newline stripped), or with ``with_extended_output`` (status,
    output, error output), the keyword arguments as GitPython's ``execute`` takes them; raises :class:`git.GitCommandError` on failure, :class:`LocalIOError` when a
    write failed because the disk is full, :class:`UsageError` when there is no git.

    ``transport``: a clone or fetch over the network, which keeps the user's transport
    configuration (credentials, proxies); what it writes is still pinned.

    Not GitPython's ``execute``: that adds this process's whole environment back, and the
    caller's git variables and configuration must stay out."""
    command = ["git", *args]
    full_env = environment(env, transport)
    try:
        done = subprocess.run(
            command,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL if istream is None else istream,
            capture_output=True,
        )
    except FileNotFoundError:
        if shutil.which("git", path=full_env.get("PATH")) is None:
            raise UsageError(GIT_MISSING) from None
        said = f"fatal: cannot change to '{cwd}': No such file or directory"
        raise git.GitCommandError(command, 128, said.encode()) from None
    if done.returncode != 0:  # the error GitPython would raise, its output's newline stripped
        exc = git.GitCommandError(
            command, done.returncode, done.stderr.removesuffix(b"\n"), done.stdout
        )
        _raise_if_disk_full(exc, args, [cwd, *(full_env.get(k) for k in _DIR_VARIABLES)])
        raise exc
    out = done.stdout
    if strip_newline_in_stdout and out.endswith(b"\n"):
        out = out[:-1]
    out = out.decode("utf-8", "surrogateescape") if stdout_as_string else out
    if with_extended_output:
        said = done.stderr.removesuffix(b"\n").decode("utf-8", "surrogateescape")
        return done.returncode, out, said
    return out


_DIR_VARIABLES = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")


def verb(args: Iterable[str]) -> str:
    """The git command of ``args`` (``checkout`` in ``-c a=b checkout -q``)."""
    words = iter(args)
    for word in words:
        if word in ("-c", "-C"):
            next(words, None)
        elif not word.startswith("-"):
            return word
    return "git"


def _raise_if_disk_full(exc: git.GitCommandError, args, places) -> None:
    """A write that failed on a full disk is exit 11, whatever git said: it often names no
    errno ("could not set 'core.repositoryformatversion'", "couldn't write HEAD.lock"), and a
    ``git am`` that could not write must not read as a patch that does not apply."""
    said = str(exc.stderr or "")
    command = verb(args)
    if not DISK_FULL_WORDS.search(said) and command not in _WRITING:
        return
    for place in places:
        if not place:
            continue
        free = _free_bytes(Path(place))
        if DISK_FULL_WORDS.search(said) or (free is not None and free < _FULL_BELOW):
            shown = f"{free >> 10} KiB free" if free is not None else "full"
            raise LocalIOError(
                f"git {command} could not write: the disk holding {place} is full ({shown}); "
                "free space, then run the same command again"
            ) from exc


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def require_git() -> None:
    """Bad input, in one line, when there is no git to run."""
    if shutil.which("git") is None:
        raise UsageError(GIT_MISSING)


def user_setting(cwd: Path | str, key: str) -> str | None:
    """``git config --get KEY`` as the user's own git sees it in ``cwd`` (system, global,
    local and their ``-c`` settings); None when unset.  For their identity only: nothing
    read this way changes the bytes of a diff."""
    env = {**without_repository_variables(os.environ), **_FIXED_ENV}
    try:
        done = subprocess.run(
            ["git", "config", "--get", key], cwd=cwd, env=env, capture_output=True, text=True
        )
    except FileNotFoundError:
        raise UsageError(GIT_MISSING) from None
    return (done.stdout.strip() or None) if done.returncode == 0 else None


@functools.cache
def _safe_directories() -> tuple[tuple[str, str], ...]:
    """The user's ``safe.directory`` entries (system and global only, as git honours them):
    a checkout owned by someone else that they trust stays usable."""
    env = {**without_repository_variables(os.environ), **_FIXED_ENV}
    command = ["git", "config", "--show-scope", "--get-all", "safe.directory"]
    try:
        done = subprocess.run(command, cwd=os.sep, env=env, capture_output=True, text=True)
    except OSError:
        return ()
    entries = []
    for line in done.stdout.splitlines():
        scope, _, value = line.partition("\t")
        if scope in ("system", "global", "command"):
            entries.append(("safe.directory", value))
    return tuple(entries)


def open_repo(path: Path) -> git.Repo:
    """``path`` as a GitPython repository, for its paths only: GitPython would run git with
    this process's environment, so every git command goes through :func:`run`."""
    try:
        return git.Repo(path)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{path} is not a git repository") from None


def is_dirty(repo: git.Repo) -> bool:
    """Tracked files modified or staged (untracked files are the user's own business)."""
    tree = repo.working_tree_dir
    if (Path(repo.git_dir) / "index").is_file() and run(tree, "diff", "--cached", "--name-only"):
        return True
    return bool(run(tree, "diff", "--name-only"))


def require_clean(repo: git.Repo, what: str) -> None:
    if is_dirty(repo):
        raise StateError(
            f"{what} {repo.working_tree_dir} has uncommitted changes; "
            "commit or stash them first (moe-patch changed nothing)"
        )
    git_dir = Path(repo.git_dir)
    for marker in ("rebase-apply", "rebase-merge", "MERGE_HEAD", "CHERRY_PICK_HEAD"):
        if (git_dir / marker).exists():
            raise StateError(
                f"{what} {repo.working_tree_dir} is in the middle of a git "
                f"{marker.split('-')[0].split('_')[0].lower()}; finish or abort it first"
            )


def last_words(output: str) -> str | None:
    """The last non-empty line of git's output, without GitPython's ``stderr: '…'`` wrapping
    (None when git said nothing)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    return lines[-1].removeprefix("stderr:").strip().strip("'")


def commit_env(name: str, email: str, date: str) -> dict[str, str]:
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_COMMITTER_DATE": date,
    }
