"""Reading one patch file of the series (``git format-patch`` form) and checking it is safe.

A patch is an mbox message: ``From:``, ``Date:``, ``Subject:`` headers, the commit
message (whose last paragraph holds trailers such as ``Upstream-Status:``), a
``---`` line, and a git diff.  Parsing never writes anything; every problem is a
:class:`~moe_patch.errors.PatchFormatError` naming the file.
"""

from __future__ import annotations

import email
import email.policy
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .errors import PatchFormatError

REQUIRED_TRAILERS = ("Upstream-Status", "Signed-off-by")
_TRAILER = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.+)$")
_SUBJECT_PREFIX = re.compile(r"^\[PATCH[^\]]*\]\s*")
_DIFF_GIT = re.compile(r"^diff --git (\S+) (\S+)$", re.MULTILINE)
_UNSAFE_MODE = re.compile(
    r"^(new file mode|new mode|old mode|deleted file mode) 120000$", re.MULTILINE
)


@dataclass
class Hunk:
    path: str
    number: int  # 1-based, within its file
    header: str  # "@@ -310,7 +310,7 @@"
    source_start: int


@dataclass
class Patch:
    id: str
    path: Path
    author: str
    date: str
    subject: str
    message: str  # the commit message body, trailers included
    diff: str
    trailers: list[tuple[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # every path the diff touches
    hunks: list[Hunk] = field(default_factory=list)

    def trailer(self, key: str) -> str | None:
        values = self.trailer_values(key)
        return values[0] if values else None

    def trailer_values(self, key: str) -> list[str]:
        return [v for k, v in self.trailers if k.lower() == key.lower()]

    @property
    def upstream_status(self) -> str:
        return self.trailer("Upstream-Status") or "Unknown"

    @property
    def reason(self) -> str:
        """The first paragraph of the message: why the patch exists."""
        return self.message.strip().split("\n\n", 1)[0].replace("\n", " ")


def read(path: Path) -> Patch:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PatchFormatError(f"cannot read patch {path}: {exc.strerror}") from None
    return parse(data, path)


def parse(data: bytes, path: Path) -> Patch:
    name = path.name
    if b"\0" in data:
        raise PatchFormatError(f"patch {name} is binary, not a text patch")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PatchFormatError(f"patch {name} is not UTF-8 text") from None
    if not text.startswith("From "):
        raise PatchFormatError(
            f"patch {name} is not in git format-patch form (no leading 'From ' line)"
        )
    diff_at = _DIFF_GIT.search(text)
    if not diff_at:
        raise PatchFormatError(f"patch {name} contains no 'diff --git' section")
    head, diff = text[: diff_at.start()], text[diff_at.start() :]
    head = head.split("\n---\n", 1)[0]  # drop a diffstat, if the patch has one
    message = email.message_from_string(head, policy=email.policy.compat32)
    subject = " ".join((message.get("Subject") or "").split())
    subject = _SUBJECT_PREFIX.sub("", subject)
    if not subject:
        raise PatchFormatError(f"patch {name} has no Subject")
    body = message.get_payload()
    if not isinstance(body, str):
        raise PatchFormatError(f"patch {name} is a multipart message; expected one patch")
    patch = Patch(
        id=path.stem,
        path=path,
        author=" ".join((message.get("From") or "").split()),
        date=message.get("Date") or "",
        subject=subject,
        message=body.strip("\n") + "\n",
        diff=diff,
        trailers=_trailers(body),
    )
    _read_diff(patch)
    return patch


def _trailers(body: str) -> list[tuple[str, str]]:
    paragraphs = [p for p in body.strip().split("\n\n") if p.strip()]
    if not paragraphs:
        return []
    found = []
    for line in paragraphs[-1].splitlines():
        match = _TRAILER.match(line.strip())
        if match:
            found.append((match.group(1), match.group(2).strip()))
    return found


def _read_diff(patch: Patch) -> None:
    name = patch.path.name
    if "GIT binary patch" in patch.diff or "\nBinary files " in patch.diff:
        raise PatchFormatError(f"patch {name} carries a binary diff; only text patches are allowed")
    if _UNSAFE_MODE.search(patch.diff):
        raise PatchFormatError(f"patch {name} creates or changes a symbolic link; refused")
    paths = []
    for a_path, b_path in _DIFF_GIT.findall(patch.diff):
        paths += [_strip_prefix(a_path, "a/", name), _strip_prefix(b_path, "b/", name)]
    for line in patch.diff.splitlines():
        for key in ("rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(key):
                paths.append(line[len(key) :])
    try:
        parsed = PatchSet(patch.diff)
    except UnidiffParseError as exc:
        detail = " ".join(str(exc).split())  # one line, whatever unidiff says
        raise PatchFormatError(f"patch {name} has a malformed diff ({detail})") from None
    if not parsed:
        raise PatchFormatError(f"patch {name} contains no file changes")
    for patched in parsed:
        for raw in (patched.source_file, patched.target_file):
            if raw and raw != "/dev/null":
                paths.append(_strip_prefix(raw, raw[:2], name))
        for number, hunk in enumerate(patched, start=1):
            header = (
                f"@@ -{hunk.source_start},{hunk.source_length} "
                f"+{hunk.target_start},{hunk.target_length} @@"
            )
            patch.hunks.append(Hunk(patched.path, number, header, hunk.source_start))
    for path in paths:
        check_path(path, name)
    patch.files = sorted(set(paths))


def _strip_prefix(raw: str, prefix: str, name: str) -> str:
    if prefix in ("a/", "b/") and raw.startswith(prefix):
        return raw[2:]
    raise PatchFormatError(f"patch {name} names {raw!r} without the a/ b/ prefixes of git diffs")


def check_path(path: str, name: str) -> None:
    """Refuse a path that could leave the tree or reach into git's own files."""
    pure = PurePosixPath(path)
    normal = posixpath.normpath(path)
    if (
        not path
        or pure.is_absolute()
        or "\\" in path
        or ".." in pure.parts
        or normal.startswith("..")
        or any(part == ".git" for part in pure.parts)
    ):
        raise PatchFormatError(f"patch {name} touches {path!r}, a path outside the tree; refused")
