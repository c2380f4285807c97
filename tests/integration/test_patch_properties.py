"""Property-based tests of the patch reader and the exporter.

* any commit moe-patch's exporter writes parses, and the parsed patch applied by the
  product (``git am`` with the parsed author and date) re-exports byte for byte;
* any byte string either parses or fails with :class:`PatchFormatError`, never another
  exception.
"""

from __future__ import annotations

import string
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moe_patch import applier, export, patchfile
from moe_patch.errors import PatchFormatError

LINE = st.text(
    alphabet=string.ascii_letters + string.digits + " _=()+-*#:.,'\"\t", min_size=0, max_size=30
)
LINES = st.lists(LINE, min_size=0, max_size=12)
NAME = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=8)
PATH = st.lists(NAME, min_size=1, max_size=3).map(lambda parts: "vllm/" + "/".join(parts) + ".py")
SUBJECT = st.text(
    alphabet=string.ascii_letters + string.digits + " :-_,.()", min_size=1, max_size=90
).filter(lambda s: s.strip() and not s.strip().startswith("["))
WORD = st.text(alphabet=string.ascii_letters, min_size=1, max_size=10)


def _git(cwd: Path, *args: str, **kwargs) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        **kwargs,
    ).stdout


def _text(lines: list[str]) -> str:
    return "".join(line.rstrip() + "\n" for line in lines)


@st.composite
def commits(draw):
    paths = draw(st.lists(PATH, min_size=1, max_size=3, unique_by=lambda p: p.split("/")[1]))
    before = {p: _text(draw(LINES)) for p in paths}
    after = dict(before)
    for path in paths:
        after[path] = _text(draw(LINES))
    if all(after[p] == before[p] for p in paths):
        after[paths[0]] = before[paths[0]] + "changed = True\n"
    new_file = draw(st.booleans())
    if new_file:
        after["vllm/new_" + draw(NAME) + ".py"] = _text(draw(LINES)) or "x = 1\n"
    subject = " ".join(draw(SUBJECT).split())
    reason = " ".join(draw(st.lists(WORD, min_size=1, max_size=12)))
    author = f"{draw(WORD)} {draw(WORD)} <{draw(WORD).lower()}@example.invalid>"
    stamp = draw(st.integers(min_value=0, max_value=2_000_000_000))
    return before, after, subject, reason, author, stamp


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(commits())
def test_exported_patches_parse_and_round_trip(tmp_path_factory, commit):
    before, after, subject, reason, author, stamp = commit
    work = tmp_path_factory.mktemp("roundtrip")
    for path, text in before.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", "base")
    base = _git(work, "rev-parse", "HEAD").strip()
    for path, text in after.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    _git(work, "add", "-A")
    message = f"{subject}\n\n{reason}\n\nUpstream-Status: Pending\nSigned-off-by: {author}\n"
    _git(
        work,
        "commit",
        "-q",
        "--author",
        author,
        "--date",
        f"@{stamp} +0000",
        "-F",
        "-",
        input=message,
    )
    exported = export.format_commit(work, "HEAD")

    patch_file = work.parent / f"{work.name}.patch"
    patch_file.write_bytes(exported)
    patch = patchfile.read(patch_file)  # must parse
    assert patch.subject == subject
    assert patch.author == author
    assert patch.upstream_status == "Pending"
    changed = {p for p in after if after[p] != before.get(p)}
    assert set(patch.files) == changed

    _git(work, "checkout", "-q", "--detach", base)
    assert applier.am(work, patch, three_way=False)  # the product's own apply step
    assert export.format_commit(work, "HEAD") == exported


def _valid_patch() -> bytes:
    return (
        b"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        b"From: A Person <a@example.invalid>\nDate: Thu, 1 Jan 2026 00:00:00 +0000\n"
        b"Subject: a change\n\nWhy.\n\nUpstream-Status: Pending\n"
        b"Signed-off-by: A Person <a@example.invalid>\n---\n"
        b"diff --git a/vllm/x.py b/vllm/x.py\nindex 1111111..2222222 100644\n"
        b"--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n--\n2.43.0\n"
    )


@st.composite
def mangled(draw):
    data = bytearray(_valid_patch())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        chunk = draw(
            st.binary(min_size=1, max_size=12)
            | st.sampled_from(
                [
                    b"\n",
                    b"../",
                    b"/",
                    b"@@ -0,0 +1 @@",
                    b"diff --git ",
                    b"\x00",
                    b"\xff",
                    b"a/",
                    b"120000",
                ]
            )
        )
        if action == "insert":
            data[at:at] = chunk
        elif action == "delete":
            del data[at : at + len(chunk)]
        elif action == "replace":
            data[at : at + len(chunk)] = chunk
        else:
            del data[at:]
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400) | mangled())
def test_any_bytes_parse_or_fail_with_the_products_error(data):
    try:
        patch = patchfile.parse(data, Path("fuzz.patch"))
    except PatchFormatError as exc:
        assert "\n" not in exc.message and exc.message.startswith("patch fuzz.patch ")
        return
    for path in patch.files:  # whatever parses is safe to apply
        patchfile.check_path(path, "fuzz.patch")
