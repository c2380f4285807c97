"""Test helpers: an isolated cache, a fake package index, synthetic releases and series."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from moe_patch import pipconfig


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """Every unit test gets its own empty cache."""
    path = tmp_path / "cache"
    monkeypatch.setenv("MOE_PATCH_CACHE", str(path))
    return path


# A made-up miniature "vLLM" source tree: just enough structure for moe-patch
# (vllm/__init__.py and a fused-MoE module with a Triton kernel definition).
KERNEL_MODULE = textwrap.dedent(
    """\
    import triton
    import triton.language as tl


    def helper():
        return 1


    @triton.jit
    def fused_moe_kernel(
        a_ptr,
        EM,
        num_valid_tokens,
        BLOCK_SIZE_M: tl.constexpr,
    ):
        pid = tl.program_id(axis=0)
        if pid * BLOCK_SIZE_M >= EM:
            return
    """
)


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (path relative to ``root`` -> text) under ``root``."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def release_files(version: str, kernel_module: str = KERNEL_MODULE) -> dict[str, str]:
    return {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        "vllm/__init__.py": "",
        "vllm/_version.py": f"__version__ = version = '{version}'\n",
        "vllm/model_executor/layers/fused_moe/fused_moe.py": kernel_module,
        ".gitignore": "vllm/_version.py\n",
    }


def make_sdist(version: str, files: dict[str, str] | None = None, extra_members=()) -> bytes:
    """A gzip'd tar laid out like an sdist: one top directory vllm-VERSION/."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in sorted((files or release_files(version)).items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra_members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


@dataclass
class FakeIndex:
    """A PEP 691 simple index for the project ``vllm`` served on localhost."""

    url: str = ""
    archives: dict[str, bytes] = field(default_factory=dict)
    listed_hash: dict[str, str] = field(default_factory=dict)  # filename -> hash to list
    listed_size: dict[str, int] = field(default_factory=dict)  # filename -> size to list
    mode: str = "ok"  # ok | garbage | error | html | truncate
    delay: float = 0.0  # seconds between pieces of a file (slow downloads)
    piece: int = 256  # bytes per piece when there is a delay
    listing_delay: float = 0.0  # the same for the listing
    stall: float = 0.0  # seconds a file's body waits after its headers
    endless: bool = False  # files: no Content-Length, an unending body (ENDLESS bytes at most)
    listing_padding: int = 0  # bytes of whitespace after the listing, without Content-Length
    requests: list[str] = field(default_factory=list)
    authorizations: dict[str, str | None] = field(default_factory=dict)  # path -> header
    sent: dict[str, int] = field(default_factory=dict)  # path -> body bytes written

    def add(self, version: str, archive: bytes | None = None) -> None:
        self.archives[f"vllm-{version}.tar.gz"] = (
            archive if archive is not None else make_sdist(version)
        )

    def listing(self) -> bytes:
        files = []
        for name, data in sorted(self.archives.items()):
            digest = self.listed_hash.get(name, hashlib.sha256(data).hexdigest())
            entry = {"filename": name, "url": f"../../files/{name}", "hashes": {"sha256": digest}}
            if name in self.listed_size:
                entry["size"] = self.listed_size[name]
            files.append(entry)
        return json.dumps({"meta": {"api-version": "1.1"}, "name": "vllm", "files": files}).encode()


ENDLESS = 256 << 20  # bytes an "endless" body sends before it gives up


def _slowly(piece: bytes, delay: float) -> bytes:
    time.sleep(delay)
    return piece


@pytest.fixture
def fake_index(cache_dir, monkeypatch):
    index = FakeIndex()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def stream(self, pieces) -> None:
            """Write ``pieces`` until the client hangs up, counting what was sent."""
            index.sent[self.path] = 0
            try:
                for piece in pieces:
                    self.wfile.write(piece)
                    self.wfile.flush()
                    index.sent[self.path] += len(piece)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self):
            index.requests.append(self.path)
            index.authorizations[self.path] = self.headers.get("Authorization")
            if index.mode == "error":
                self.send_error(503)
                return
            if self.path == "/simple/vllm/":
                if index.mode == "garbage":
                    body, kind = b"\x00 not a listing {", "application/vnd.pypi.simple.v1+json"
                elif index.mode == "html":
                    links = "".join(
                        f'<a href="../../files/{n}#sha256={hashlib.sha256(d).hexdigest()}">{n}</a>'
                        for n, d in index.archives.items()
                    )
                    body, kind = f"<html><body>{links}</body></html>".encode(), "text/html"
                else:
                    body, kind = index.listing(), "application/vnd.pypi.simple.v1+json"
            elif self.path.startswith("/files/") and self.path[7:] in index.archives:
                body, kind = index.archives[self.path[7:]], "application/gzip"
                if index.mode == "truncate":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.close()
                    return
            else:
                self.send_error(404)
                return
            is_file = self.path.startswith("/files/")
            unsized = (index.endless and is_file) or (index.listing_padding and not is_file)
            self.send_response(200)
            self.send_header("Content-Type", kind)
            if unsized:
                self.send_header("Connection", "close")
            else:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            delay = index.delay if is_file else index.listing_delay
            if is_file and index.stall:
                time.sleep(index.stall)
            if unsized:
                extra = index.listing_padding if not is_file else ENDLESS
                filler = (b"\0" if is_file else b" ") * (1 << 20)
                self.stream([body, *(filler for _ in range(extra >> 20))])
            elif delay:
                pieces = range(0, len(body), index.piece)
                self.stream(_slowly(body[at : at + index.piece], delay) for at in pieces)
            else:
                self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # serve_forever notices shutdown() at its next poll: 0.5 s by default, per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    index.url = f"http://127.0.0.1:{server.server_port}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    monkeypatch.delenv("PIP_CERT", raising=False)
    pipconfig._configured.cache_clear()
    yield index
    server.shutdown()
    server.server_close()


def git(cwd: Path, *args: str) -> str:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def tree_digest(path: Path) -> str:
    """A hash of every file's path, mode and bytes under ``path`` (.git included)."""
    digest = hashlib.sha256()
    if not path.exists():
        return "absent"
    for item in sorted(path.rglob("*")):
        rel = item.relative_to(path).as_posix()
        if item.is_symlink():
            digest.update(f"L {rel} {os.readlink(item)}\n".encode())
        elif item.is_file():
            digest.update(f"F {rel} {item.stat().st_mode:o}\n".encode())
            digest.update(item.read_bytes())
        else:
            digest.update(f"D {rel}\n".encode())
    return digest.hexdigest()


PATCH_AUTHOR = "Test Author <author@example.invalid>"


def author_series(
    root: Path, base: str, patches: list[dict], files: dict[str, str] | None = None
) -> Path:
    """Write a series for ``base`` under ``root`` by committing edits on a synthetic
    tree and exporting each commit with moe-patch's own exporter.

    Each entry of ``patches``: ``id``, ``edit`` ({path: new text}), optional
    ``trailers`` (list of lines) and ``subject``.
    """
    from moe_patch import export

    work = root.parent / f"author-{base}-{len(list(root.parent.glob('author-*')))}"
    write_files(work, files or release_files(base))
    git(work, "init", "-q")
    git(work, "add", "-A", "-f")
    git(work, "commit", "-q", "-m", "base")
    directory = root / f"v{base}"
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for spec in patches:
        write_files(work, spec["edit"])
        git(work, "add", "-A", "-f")
        trailers = spec.get(
            "trailers", ["Upstream-Status: Pending", f"Signed-off-by: {PATCH_AUTHOR}"]
        )
        message = (
            f"{spec.get('subject', spec['id'])}\n\nWhy {spec['id']} exists.\n\n"
            + "\n".join(trailers)
            + "\n"
        )
        env_args = ["-c", "user.name=x", "-c", "user.email=x@example.invalid"]
        subprocess.run(
            [
                "git",
                *env_args,
                "commit",
                "-q",
                "--author",
                PATCH_AUTHOR,
                "--date",
                "2026-01-01T00:00:00+00:00",
                "-F",
                "-",
            ],
            cwd=work,
            input=message,
            text=True,
            check=True,
            capture_output=True,
        )
        name = f"{spec['id']}.patch"
        (directory / name).write_bytes(export.format_commit(work, "HEAD"))
        names.append(name)
    (directory / "series").write_text("".join(f"{n}\n" for n in names))
    return root


def kernel_with_decorator(decorator: str, extra_line: str = "") -> str:
    return KERNEL_MODULE.replace(
        "@triton.jit\ndef fused_moe_kernel", f"{extra_line}{decorator}\ndef fused_moe_kernel"
    )


JIT_EDIT = {
    "vllm/model_executor/layers/fused_moe/fused_moe.py": kernel_with_decorator(
        '@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])'
    )
}
JIT_PROBE = (
    "Upstream-Probe: triton-no-specialize vllm/model_executor/layers/fused_moe/fused_moe.py "
    "fused_moe_kernel EM num_valid_tokens"
)


@pytest.fixture
def series_root(tmp_path, monkeypatch, authored_series):
    """A synthetic two-patch series for base 1.0.0, selected through MOE_PATCH_SERIES: a
    copy of the session's, which each test may change."""
    root = tmp_path / "patches"
    shutil.copytree(authored_series, root)
    monkeypatch.setenv("MOE_PATCH_SERIES", str(root))
    return root


@pytest.fixture(scope="session")
def authored_series(tmp_path_factory):
    """The two-patch series, authored once (git init, commits, export) per session."""
    root = tmp_path_factory.mktemp("authored") / "patches"
    author_series(
        root,
        "1.0.0",
        [
            {
                "id": "jit",
                "edit": JIT_EDIT,
                "trailers": [
                    "Upstream-Status: Pending",
                    JIT_PROBE,
                    f"Signed-off-by: {PATCH_AUTHOR}",
                ],
            },
            {"id": "extra", "edit": {"vllm/extra.py": "FEATURE = True\n"}},
        ],
    )
    # Ran on a GPU, so apply and wheel print no warning that tests of their output would see
    # (tests/integration/test_gpu_runs.py removes it).
    (root / "v1.0.0" / "gpu-runs.json").write_text(json.dumps({"runs": [SYNTHETIC_GPU_RUN]}))
    return root


SYNTHETIC_GPU_RUN = {
    "kind": "kernel-tests",
    "vllm": "1.0.0",
    "gpu": "NVIDIA H200",
    "date": "2026-01-01",
    "series_version": "0.0.0",
    "result": "native-tests/synthetic.txt",
}


def unrelated_repo(root: Path) -> Path:
    """A user's own repository, with a remote: what a git hook's GIT_DIR would point at."""
    repo = root / "hook-repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "f").write_text("mine\n")
    git(repo, "add", "f")
    git(repo, "commit", "-qm", "mine")
    git(repo, "remote", "add", "origin", "https://example.invalid/mine.git")
    return repo


def release_checkout(source: Path, notes: int = 0) -> Path:
    """A git checkout of release 1.0.0's files, with ``notes`` extra commits of loose objects."""
    write_files(source, release_files("1.0.0"))
    git(source, "init", "-q", "-b", "main")
    git(source, "config", "user.name", "Jane Dev")
    git(source, "config", "user.email", "jane.dev@users.noreply.github.com")
    git(source, "add", "-A", "-f")
    git(source, "commit", "-q", "-m", "release")
    for step in range(notes):
        (source / "notes" / f"{step}.txt").parent.mkdir(exist_ok=True)
        (source / "notes" / f"{step}.txt").write_text(f"note {step}\n" * 50)
        git(source, "add", "-A")
        git(source, "commit", "-q", "-m", f"note {step}")
    git(source, "tag", "v1.0.0")
    return source


def tar_member(name, kind=tarfile.REGTYPE, linkname=""):
    """A (TarInfo, data) pair for a hostile or odd archive member: a file holding b"x",
    or a link, directory or device of ``kind``."""
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    data = b"x" if kind == tarfile.REGTYPE else None
    info.size = len(data) if data else 0
    return info, data


def user_gitconfig(root: Path, monkeypatch, text: str) -> Path:
    """A HOME whose ~/.gitconfig holds ``text``: the user's global git configuration."""
    home = root / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(text)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    return home


def mount_tmpfs(mountpoint: Path, size: str) -> Path:
    """A tmpfs of ``size`` at ``mountpoint`` (skips where mounting one is not allowed); the
    caller unmounts it."""
    mountpoint.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()})")
    return mountpoint
