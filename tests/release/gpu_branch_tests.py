"""The new tests of ``moe-patch pr``'s branches that need a GPU, run on their base and on the
branch on a GPU machine: the proof vLLM's checklist asks for, where CI (no GPU) cannot give it.

A GPU machine here has no network and no vLLM, and a command carries 64 MiB, so:

1. Here, after ``moe-patch pr --source CLONE --onto v0.33.0``, ``pack`` writes, per named
   branch, its parent's tree (``vllm/``, ``tests/``, ``pyproject.toml``) with the files the
   release's own wheel adds to it (vLLM's extension modules and FlashAttention's package:
   the tests load vLLM's compiled ops), in ``tar.xz`` parts of ``--part-mib``, the branch's
   commit (``git format-patch``) and a manifest of commits, tests and hashes::

       python tests/release/gpu_branch_tests.py pack --source CLONE \\
           --branch moe-patch/swap-ab-split-k --wheel vllm-0.33.0-cp38-abi3-*.whl --out DIR

   and ``pip download`` the wheels ``gpu_branch_requirements.txt`` lists (what the image lacks).
2. Carry the parts and the wheels to ``.gpu/bt/<n>/`` over consecutive calls to one warm
   machine (each part under the call's limit with the repository; one release's pack at a
   time: the script takes every part it finds there), then run
   ``bash tests/release/gpu_branch_tests.sh``: a venv of the image's packages and the wheels,
   then ``run``, which rebuilds each base as a one-commit repository (registered as vLLM
   ``X.Y.Z``, as an editable install is, since vLLM picks its CUDA platform only then),
   applies the branch's commit with ``git am`` and runs the branch's new tests on both with
   ``moe_patch.pr_tests``, the code ``moe-patch pr`` runs them with.  One JSON per branch.

The records live in ``kernels/results/branch-tests/``; a passing one is listed in the series'
``gpu-runs.json`` (kind ``branch-tests``), which ``tests/integration/test_gpu_runs.py``
recomputes, and ``tests/release/test_pr_release.py`` checks that a run shows the change each
branch makes today.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

TREE_PATHS = ("vllm", "tests", "pyproject.toml")
FLASH_ATTN = "vllm/vllm_flash_attn/"
# As a record names it: <packed> holds every part of the pack, <venv> is a venv whose
# packages are the GPU machine's and the wheels of vLLM's requirements it lacks.
COMMAND = (
    "PYTHONPATH=tooling <venv>/bin/python tests/release/gpu_branch_tests.py run "
    "--packed <packed> --python <venv>/bin/python --out $OUT"
)
IDENTITY = {
    "GIT_AUTHOR_NAME": "moe-patch",
    "GIT_AUTHOR_EMAIL": "moe-patch@localhost",
    "GIT_COMMITTER_NAME": "moe-patch",
    "GIT_COMMITTER_EMAIL": "moe-patch@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, env={**os.environ, **IDENTITY}
    )
    if done.returncode != 0:
        sys.exit(f"git {args[0]} failed in {cwd}: {done.stderr.decode().strip()}")
    return done.stdout.decode().strip()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def diff_sha256(source: Path, parent: str, commit: str) -> str:
    """What the branch changes, independent of its commit's dates and identity."""
    diff = git(source, "diff", "--full-index", "--no-color", "--no-ext-diff", parent, commit)
    return hashlib.sha256(diff.encode()).hexdigest()


def _built_members(wheel: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    """What a source tree lacks to run vLLM's kernel tests, as the release's wheel has it:
    vLLM's own extension modules and the FlashAttention package with its FA3 kernels, which
    vLLM's CUDA platform imports (FA2's, unused on Hopper, and the third-party packages stay
    out: the kernel tests of the fused MoE load none of them)."""
    return [
        info
        for info in wheel.infolist()
        if (info.filename.count("/") == 1 and info.filename.endswith(".so"))
        or (info.filename.startswith(FLASH_ATTN) and "_vllm_fa2_C" not in info.filename)
    ]


def _pack_tree(source: Path, parent: str, wheel: Path, out: Path, part_mib: int) -> dict:
    """The parent's source tree with the wheel's built files, as ``tar.xz`` parts."""
    name = f"tree-{parent[:12]}.tar"
    tar = out / name
    git(source, "archive", "--format=tar", "-o", str(tar), parent, *TREE_PATHS)
    with zipfile.ZipFile(wheel) as built, tarfile.open(tar, "a") as archive:
        for info in _built_members(built):
            member = tarfile.TarInfo(info.filename)
            member.size, member.mode = (
                info.file_size,
                0o755 if info.filename.endswith(".so") else 0o644,
            )
            with built.open(info) as data:
                archive.addfile(member, data)
    subprocess.run(["xz", "-T2", "-9", "-f", str(tar)], check=True)
    packed = out / f"{name}.xz"
    parts, size = [], part_mib << 20
    with open(packed, "rb") as whole:
        for index, chunk in enumerate(iter(lambda: whole.read(size), b"")):
            part = out / f"{packed.name}.part{index:02d}"
            part.write_bytes(chunk)
            parts.append({"name": part.name, "sha256": hashlib.sha256(chunk).hexdigest()})
    digest = sha256(packed)
    packed.unlink()
    return {"tree_archive": packed.name, "tree_archive_sha256": digest, "tree_parts": parts}


def pack(source: Path, branches: list[str], wheel: Path, out: Path, part_mib: int) -> None:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    old = json.loads(manifest_path.read_text())["branches"] if manifest_path.exists() else []
    entries = []
    trees: dict[str, dict] = {}
    for branch in branches:
        commit = git(source, "rev-parse", f"{branch}^{{commit}}")
        parent = git(source, "rev-parse", f"{commit}^")
        tests = git(
            source, "diff", "--name-only", "--diff-filter=A", parent, commit, "--", "tests/"
        ).splitlines()
        tests = [t for t in tests if Path(t).name.startswith("test_") and t.endswith(".py")]
        if parent not in trees:
            trees[parent] = _pack_tree(source, parent, wheel, out, part_mib)
        patch = out / f"{parent[:12]}-{branch.replace('/', '-')}.patch"
        patch.write_text(git(source, "format-patch", "-1", "--stdout", commit) + "\n")
        entries.append({
            "branch": branch,
            "commit": commit,
            "parent": parent,
            "parent_describe": git(source, "describe", "--tags", "--always", parent),
            "tests": tests,
            "wheel": wheel.name,
            "wheel_sha256": sha256(wheel),
            **trees[parent],
            "patch": patch.name,
            "patch_sha256": sha256(patch),
            "diff_sha256": diff_sha256(source, parent, commit),
        })  # fmt: skip
    here = Path(__file__).resolve().parents[2]
    manifest = {
        "tree_paths": [*TREE_PATHS, "the wheel's vllm/*.so", f"the wheel's {FLASH_ATTN} but FA2"],
        "moe_patch_commit": git(here, "rev-parse", "HEAD"),
        "branches": [e for e in old if e["commit"] not in {n["commit"] for n in entries}] + entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{out}: {len(entries)} branch(es) packed")


def _rebuild(packed: Path, entry: dict, scratch: Path) -> tuple[Path, str, str]:
    """A repository whose first commit is the base tree and whose second the branch's."""
    if sha256(packed / entry["patch"]) != entry["patch_sha256"]:
        sys.exit(f"{entry['patch']} does not match the manifest: pack it again")
    whole = scratch / entry["tree_archive"]
    with open(whole, "wb") as joined:
        for part in entry["tree_parts"]:
            if not (packed / part["name"]).exists():
                sys.exit(f"{part['name']} is missing from {packed}: carry every part")
            joined.write((packed / part["name"]).read_bytes())
    if sha256(whole) != entry["tree_archive_sha256"]:
        sys.exit(f"{entry['tree_archive']} does not match the manifest: pack it again")
    repo = scratch / "vllm"
    repo.mkdir()
    with tarfile.open(whole) as archive:
        archive.extractall(repo, filter="data")
    whole.unlink()
    # vLLM finds its platform only when it is installed (its version says "cpu" or not):
    # register the tree as `pip install -e .` does, with the release's name and version.
    version = entry["wheel"].split("-")[1]
    info = repo / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", entry["parent_describe"])
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "am", "-q", "--keep-cr", str(packed / entry["patch"]))
    return repo, base, git(repo, "rev-parse", "HEAD")


# Where the GPU machine keeps its packages: pytest's warnings name files there.
SITE_PACKAGES = re.compile(r"(?:\.\./)*/?(?:[\w.-]+/)*site-packages/")
# The copy of a tree pr_tests runs a test in (under moe-patch's cache): a collection error
# names the test file there.
PR_TESTS_COPY = re.compile(r"/?(?:[\w.-]+/)*prtests-[\w.-]+/")


def _anonymous(output: str) -> str:
    """pytest's output without the GPU machine's paths (a record names no machine)."""
    return PR_TESTS_COPY.sub("<scratch>/", SITE_PACKAGES.sub("<site-packages>/", output))


def _gpu_name(python: str) -> str:
    probe = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return done.stdout.strip() or "no GPU"


def run(packed: Path, python_path: str, out: Path) -> int:
    from moe_patch import __version__, pr_tests

    packed = packed.resolve()
    manifest = json.loads((packed / "manifest.json").read_text())
    if os.sep in python_path:  # the tests run inside the rebuilt trees
        python_path = str(Path(python_path).absolute())
    python, why = pr_tests.find_python(Path.cwd(), python_path)
    if python is None:
        sys.exit(f"no Python to run the tests with: {why}")
    gpu = _gpu_name(python.path)
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for entry in manifest["branches"]:
        with tempfile.TemporaryDirectory() as scratch:
            repo, base, branch = _rebuild(packed, entry, Path(scratch))
            evidence = pr_tests.evidence_for(
                repo, base, branch, entry["tests"], entry["parent_describe"], python, ""
            )
            for side in (evidence.base, evidence.branch):
                if side is not None:
                    side.output_tail = _anonymous(side.output_tail.replace(scratch, "<scratch>"))
        verdicts = evidence.verdicts()
        failed += sum(ok is not True for _, ok, _ in verdicts)
        record = {
            "what": "a pull-request branch's new tests on its base and on the branch",
            "command": COMMAND,
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "gpu": gpu,
            "python": evidence.python,
            "moe_patch_version": __version__,
            "moe_patch_commit": manifest["moe_patch_commit"],
            "tree_paths": manifest["tree_paths"],
            **entry,
            "verdicts": [{"test": t, "shown": ok, "detail": d} for t, ok, d in verdicts],
            "on_base": asdict(evidence.base) if evidence.base else None,
            "on_branch": asdict(evidence.branch) if evidence.branch else None,
        }
        name = f"{entry['parent_describe']}-{entry['branch'].replace('/', '-')}.json"
        (out / name).write_text(json.dumps(record, indent=1) + "\n")
        for test, ok, detail in verdicts:
            print(f"{entry['parent_describe']} {entry['branch']} {test}: "
                  f"{'shown' if ok else 'NOT shown'}: {detail}")  # fmt: skip
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("pack")
    p.add_argument("--source", type=Path, required=True)
    p.add_argument("--branch", action="append", required=True)
    p.add_argument("--wheel", type=Path, required=True, help="the base release's vLLM wheel")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--part-mib", type=int, default=45)
    r = verbs.add_parser("run")
    r.add_argument("--packed", type=Path, required=True)
    r.add_argument("--python", required=True)
    r.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.verb == "pack":
        pack(args.source, args.branch, args.wheel, args.out, args.part_mib)
        return 0
    return run(args.packed, args.python, args.out)


if __name__ == "__main__":
    sys.exit(main())
