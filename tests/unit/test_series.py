"""Reading and checking the series and its patch files."""

from pathlib import Path

import pytest
from moe_patch import patchfile, probes, series
from moe_patch.errors import PatchFormatError, UsageError

REPO_PATCHES = Path(__file__).resolve().parents[2] / "patches"

GOOD = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A Person
 <a@example.invalid>
Date: Thu, 1 Jan 2026 00:00:00 +0000
Subject: fused_moe: a change with a long subject that git folds over
 two lines

Why the change exists.

Upstream-Status: Pending
Signed-off-by: A Person <a@example.invalid>

diff --git a/vllm/x.py b/vllm/x.py
index 0000000000000000000000000000000000000000..1111111111111111111111111111111111111111 100644
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,3 +1,3 @@
 a
-b
+B
 c
"""


def parse(text: str) -> patchfile.Patch:
    return patchfile.parse(text.encode(), Path("p.patch"))


def test_parse_good_patch():
    patch = parse(GOOD)
    assert patch.subject == "fused_moe: a change with a long subject that git folds over two lines"
    assert patch.author == "A Person <a@example.invalid>"
    assert patch.reason == "Why the change exists."
    assert patch.upstream_status == "Pending"
    assert patch.files == ["vllm/x.py"]
    assert [(h.path, h.number, h.header) for h in patch.hunks] == [
        ("vllm/x.py", 1, "@@ -1,3 +1,3 @@")
    ]


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda t: t.replace("vllm/x.py", "../x.py"), "touches '../x.py', a path outside the tree"),
        (
            lambda t: t.replace("a/vllm/x.py", "a//etc/x.py").replace("b/vllm/x.py", "b//etc/x.py"),
            "a path outside the tree",
        ),
        (lambda t: t.replace("vllm/x.py", "vllm/.git/config"), "a path outside the tree"),
        (
            lambda t: t.replace("index 0000", "new file mode 120000\nindex 0000"),
            "creates or changes a symbolic link",
        ),
        (lambda t: t + "GIT binary patch\nliteral 0\n", "binary diff"),
        (
            lambda t: t.replace("@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n", "@@ -1,3 +1,3 @@\n a\n"),
            "malformed diff",
        ),
        (lambda t: t[: t.index("diff --git")], "contains no 'diff --git' section"),
        (lambda t: t.replace("From 0000", "Frm 0000"), "not in git format-patch form"),
        (
            lambda t: t.replace(
                "Subject: fused_moe: a change with a long subject that git folds over\n two lines",
                "Subject: ",
            ),
            "has no Subject",
        ),
    ],
    ids=[
        "dotdot",
        "absolute",
        "dot-git",
        "symlink",
        "binary",
        "truncated",
        "no-diff",
        "not-mbox",
        "no-subject",
    ],
)
def test_bad_patches_are_refused(mangle, message):
    with pytest.raises(PatchFormatError, match=message) as err:
        parse(mangle(GOOD))
    assert "\n" not in str(err.value)


def test_binary_bytes_are_refused():
    with pytest.raises(PatchFormatError, match="is binary"):
        patchfile.parse(b"From x\0\xff", Path("p.patch"))


def write_series(tmp_path, names, files):
    directory = tmp_path / "v1.0.0"
    directory.mkdir()
    (directory / "series").write_text("".join(f"{n}\n" for n in names))
    for name in files:
        (directory / name).write_text(GOOD)
    return tmp_path


def test_series_listing_a_missing_file(tmp_path):
    root = write_series(tmp_path, ["a.patch", "gone.patch"], ["a.patch"])
    with pytest.raises(PatchFormatError, match="lists gone.patch, which does not exist"):
        series.load("1.0.0", root)


def test_series_listing_a_patch_twice(tmp_path):
    root = write_series(tmp_path, ["a.patch", "a.patch"], ["a.patch"])
    with pytest.raises(PatchFormatError, match="lists a.patch twice"):
        series.load("1.0.0", root)


def test_series_comments_and_quilt_options(tmp_path):
    root = write_series(
        tmp_path, ["# comment", "a.patch -p1", "", "b.patch"], ["a.patch", "b.patch"]
    )
    assert series.load("1.0.0", root).ids() == ["a", "b"]


def test_base_selection(tmp_path):
    for base in ("0.20.0", "0.25.0"):
        (tmp_path / f"v{base}").mkdir()
        (tmp_path / f"v{base}" / "series").write_text("")
    assert series.bases(tmp_path) == ["0.20.0", "0.25.0"]
    assert series.base_for("0.20.0", tmp_path) == "0.20.0"
    assert series.base_for("0.24.0", tmp_path) == "0.20.0"
    assert series.base_for("0.33.0", tmp_path) == "0.25.0"
    with pytest.raises(UsageError, match="oldest base is 0.20.0"):
        series.base_for("0.19.1", tmp_path)


def test_unknown_probe_is_refused():
    with pytest.raises(PatchFormatError, match="unknown Upstream-Probe"):
        probes.parse("grep fused_moe", "p.patch")
    with pytest.raises(PatchFormatError, match="outside the tree"):
        probes.parse("kernel-param ../x.py k p", "p.patch")


def test_probe_reads_decorators(tmp_path):
    (tmp_path / "m.py").write_text(
        "import triton\n@triton.jit(do_not_specialize=['EM'])\ndef k(EM, n, SWAP_AB: 'tl.constexpr'):\n    pass\n"
    )
    assert probes.triton_no_specialize(tmp_path, "m.py", "k", "EM").found
    assert not probes.triton_no_specialize(tmp_path, "m.py", "k", "EM", "n").found
    assert probes.kernel_param(tmp_path, "m.py", "k", "SWAP_AB").found
    assert not probes.kernel_param(tmp_path, "m.py", "k", "SPLIT_K").found
    assert not probes.kernel_param(tmp_path, "missing.py", "k", "x").found


def test_shipped_series_is_well_formed():
    """Every shipped patch parses, is safe, and carries the required trailers."""
    bases = series.bases(REPO_PATCHES)
    assert bases, "no series shipped"
    for base in bases:
        loaded = series.load(base, REPO_PATCHES)
        listed = set(loaded.ids())
        on_disk = {p.stem for p in loaded.directory.glob("*.patch")}
        assert listed == on_disk, f"v{base}: series and files disagree"
        for patch in loaded.patches:
            for key in patchfile.REQUIRED_TRAILERS:
                assert patch.trailer(key), f"{patch.path.name} lacks {key}"
            assert len(patch.reason) > 40, f"{patch.path.name} does not say why it exists"
            for declaration in patch.trailer_values("Upstream-Probe"):
                probes.parse(declaration, patch.path.name)


def test_defines_and_calls_probes_read_the_tree(tmp_path):
    """A patch a later one edits no longer reverse-applies on a tree with both: these
    probes recognise it by a name it defines or a call its kernel makes."""
    source = tmp_path / "vllm" / "m.py"
    source.parent.mkdir()
    source.write_text(
        "import triton.language as tl\n\nLIMIT: int = 4\n\n\ndef helper():\n    pass\n\n\n"
        "def kernel(c):\n    tl.atomic_add(c, 1)\n"
    )
    assert probes.run("defines vllm/m.py helper", tmp_path, "p.patch").found
    assert probes.run("defines vllm/m.py LIMIT", tmp_path, "p.patch").found
    assert not probes.run("defines vllm/m.py nothing", tmp_path, "p.patch").found
    assert probes.run("calls vllm/m.py kernel tl.atomic_add", tmp_path, "p.patch").found
    assert not probes.run("calls vllm/m.py helper tl.atomic_add", tmp_path, "p.patch").found
    assert not probes.run("calls vllm/gone.py kernel tl.store", tmp_path, "p.patch").found
