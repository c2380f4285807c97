"""``moe-patch rebase`` on synthetic releases: clean, refreshed, dropped, conflicts."""

import os
import re

from click.testing import CliRunner
from moe_patch import patchfile
from moe_patch.cli import main
from support import (
    KERNEL_MODULE,
    git,
    kernel_with_decorator,
    make_sdist,
    release_files,
    tree_digest,
    write_files,
)

KERNEL_PATH = "vllm/model_executor/layers/fused_moe/fused_moe.py"
JIT_DECORATOR = '@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])'


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def rows(output: str) -> dict[str, str]:
    """patch id -> result, from the rebase table."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("jit", "extra"):
            found[parts[0]] = " ".join(parts[1:3]) if parts[1] == "dropped" else parts[1]
    return found


def add_release(fake_index, version, kernel=KERNEL_MODULE):
    fake_index.add(version, make_sdist(version, release_files(version, kernel)))


def test_moved_and_changed_context_is_refreshed(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    moved = "# a new header comment\n# and one more line\n" + KERNEL_MODULE.replace(
        "    return 1\n", "    return 2  # changed\n"
    )
    add_release(fake_index, "1.1.0", moved)
    before = (series_root / "v1.0.0").joinpath("jit.patch").read_bytes()
    into = tmp_path / "work"
    result = run("rebase", "--onto", "1.1.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert rows(result.stdout) == {"jit": "refreshed", "extra": "clean"}
    assert "context changed; merged 3-way" in result.stdout
    new = series_root / "v1.1.0"
    assert (new / "series").read_text() == "jit.patch\nextra.patch\n"
    jit = patchfile.read(new / "jit.patch")
    assert jit.hunks[0].source_start == 8 and jit.upstream_status == "Pending"
    assert b"Patch-Filename" not in (new / "jit.patch").read_bytes()
    assert (series_root / "v1.0.0" / "jit.patch").read_bytes() == before  # old series kept
    assert "range-diff v1.0.0 -> v1.1.0:" in result.stdout
    assert re.search(r"1: +[0-9a-f]+ ! 1: +[0-9a-f]+ jit", result.stdout)
    assert git(into, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.1.0"
    # the new series applies exactly to its own release
    applied = run("apply", "--vllm", "1.1.0", "--into", str(tmp_path / "t"), "--json")
    assert applied.exit_code == 0 and '"status": "applied",' in applied.stdout
    assert '"applied (3-way)"' not in applied.stdout
    # and the rebase tree is ready for export
    assert run("export", str(into), "--check").exit_code == 0


def test_lines_moved_only(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    add_release(fake_index, "1.2.0", "# one\n# two\n" + KERNEL_MODULE)
    result = run("rebase", "--onto", "1.2.0", "--into", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    assert "context moved: hunk 1 line 6 -> 8" in result.stdout


def test_already_upstream_is_dropped_and_recorded(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    upstream = kernel_with_decorator('@triton.jit(do_not_specialize=["num_valid_tokens", "EM"])')
    add_release(fake_index, "1.4.0", upstream)
    result = run("rebase", "--onto", "1.4.0", "--into", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    assert rows(result.stdout) == {"jit": "dropped (already", "extra": "clean"}
    assert "Applied-Upstream: 1.4.0 (probe: fused_moe_kernel already marks" in result.stdout
    assert (series_root / "v1.4.0" / "series").read_text() == "extra.patch\n"
    old = patchfile.read(series_root / "v1.0.0" / "jit.patch")
    assert old.trailer("Applied-Upstream") == "1.4.0"
    trailers = [k for k, _ in old.trailers]
    assert trailers.index("Applied-Upstream") < trailers.index("Signed-off-by")
    # the old series is still what its commits export to
    verify = run("verify", "--vllm", "1.0.0", "--json")
    assert verify.exit_code == 0, verify.output


def test_applied_upstream_names_the_first_release_that_has_it(fake_index, series_root, tmp_path):
    from moe_patch import trees

    fake_index.add("1.0.0")
    fake_index.add("1.1.0")
    upstream = kernel_with_decorator('@triton.jit(do_not_specialize=["EM", "num_valid_tokens"])')
    for version in ("1.2.0", "1.3.0", "1.4.0"):
        add_release(fake_index, version, upstream)
    for version in ("1.1.0", "1.3.0"):  # cached; 1.2.0 is not, so it cannot be told
        trees.release_repo(version)
    result = run("rebase", "--onto", "1.4.0", "--into", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    assert "Applied-Upstream: 1.3.0" in result.stdout
    assert patchfile.read(series_root / "v1.0.0" / "jit.patch").trailer("Applied-Upstream") == (
        "1.3.0"
    )


def conflicting_release(fake_index, version="1.5.0"):
    fake_index.add("1.0.0")
    add_release(fake_index, version, kernel_with_decorator("@triton.jit(launch_metadata=None)"))


def start_conflict(fake_index, tmp_path):
    conflicting_release(fake_index)
    into = tmp_path / "w"
    result = run("rebase", "--onto", "1.5.0", "--into", str(into))
    return into, result


def test_conflict_stops_then_continue(fake_index, series_root, tmp_path, monkeypatch):
    into, result = start_conflict(fake_index, tmp_path)
    assert result.exit_code == 9
    assert rows(result.stdout) == {"jit": "conflict", "extra": "pending"}
    assert f"    {into}/{KERNEL_PATH}" in result.stdout
    assert f"moe-patch rebase --continue --into {into}" in result.stdout
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "patch jit conflicts with vLLM 1.5.0" in errors[0]
    kernel = into / KERNEL_PATH
    assert "<<<<<<<" in kernel.read_text()
    assert not (series_root / "v1.5.0").exists()

    # not resolved yet
    monkeypatch.chdir(into)  # like git: --continue from inside the tree
    again = run("rebase", "--continue")
    assert again.exit_code == 7 and "still has conflict markers" in again.stderr

    resolved = re.sub(
        r"<<<<<<< .*?>>>>>>> [^\n]*\n",
        '@triton.jit(launch_metadata=None, do_not_specialize=["EM", "num_valid_tokens"])\n',
        kernel.read_text(),
        flags=re.S,
    )
    kernel.write_text(resolved)
    git(into, "add", KERNEL_PATH)
    done = run("rebase", "--continue")
    assert done.exit_code == 0, done.output
    assert rows(done.stdout) == {"jit": "refreshed", "extra": "clean"}
    assert "conflict resolved by hand" in done.stdout
    new = (series_root / "v1.5.0" / "jit.patch").read_text()
    assert '+@triton.jit(launch_metadata=None, do_not_specialize=["EM", "num_valid_tokens"])' in new
    assert run("rebase", "--continue").exit_code == 2  # nothing in progress any more


def test_conflict_then_skip(fake_index, series_root, tmp_path):
    into, result = start_conflict(fake_index, tmp_path)
    assert result.exit_code == 9
    done = run("rebase", "--skip", "--into", str(into))
    assert done.exit_code == 0, done.output
    assert rows(done.stdout) == {"jit": "dropped (skipped)", "extra": "clean"}
    assert (series_root / "v1.5.0" / "series").read_text() == "extra.patch\n"
    assert patchfile.read(series_root / "v1.0.0" / "jit.patch").trailer("Applied-Upstream") is None


def test_conflict_then_abort_leaves_nothing(fake_index, series_root, tmp_path, monkeypatch):
    before = tree_digest(series_root)
    monkeypatch.chdir(tmp_path)
    into, result = start_conflict(fake_index, tmp_path)
    assert result.exit_code == 9
    aborted = run("rebase", "--abort")  # found as the one rebase below the current directory
    assert aborted.exit_code == 0, aborted.output
    assert "aborted" in aborted.stdout
    assert not into.exists()
    assert tree_digest(series_root) == before


def test_bad_input_changes_nothing(fake_index, series_root, tmp_path):
    conflicting_release(fake_index)
    before = tree_digest(series_root)
    into = tmp_path / "w"
    cases = [
        (["--onto", "1.0.0"], "no series older than 1.0.0 to carry forward"),
        (["--onto", "1.0.0", "--from", "1.0.0"], "already based on 1.0.0"),
        (["--onto", "1.9.0"], "unknown vLLM version 1.9.0"),
        (["--onto", "1.5.0", "--from", "0.5.0"], "there is no series for base 0.5.0"),
        (["--continue"], "no moe-patch rebase is in progress"),
        (["--continue", "--onto", "1.5.0"], "--continue takes no --onto"),
        (["--skip", "--abort"], "give one of --continue, --skip, --abort"),
        ([], "say where to: --onto VERSION"),
    ]
    for args, message in cases:
        result = run("rebase", *args, "--into", str(into))
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
        assert not into.exists()
    os.makedirs(series_root / "v1.5.0")
    result = run("rebase", "--onto", "1.5.0", "--into", str(into))
    assert result.exit_code == 2 and "v1.5.0 already exists" in result.stderr
    assert not into.exists()
    os.rmdir(series_root / "v1.5.0")
    assert tree_digest(series_root) == before


def test_onto_from_a_source_tree(fake_index, series_root, tmp_path):
    """A release the index has never seen, from an unpacked tree."""
    fake_index.add("1.0.0")
    source = tmp_path / "src"
    write_files(source, release_files("2.0.0", "# a\n" + KERNEL_MODULE))
    result = run(
        "rebase", "--onto", "2.0.0", "--source", str(source), "--into", str(tmp_path / "w")
    )
    assert result.exit_code == 0, result.output
    assert (series_root / "v2.0.0" / "series").read_text() == "jit.patch\nextra.patch\n"
    wrong = run("rebase", "--onto", "2.1.0", "--source", str(source), "--into", str(tmp_path / "x"))
    assert wrong.exit_code == 2 and "is vLLM 2.0.0, not 2.1.0" in wrong.stderr


def test_onto_a_release_cloned_with_git(fake_index, series_root, tmp_path):
    from moe_patch import trees

    fake_index.add("1.0.0")
    add_release(fake_index, "1.6.0", "# a\n" + KERNEL_MODULE)
    remote = trees.release_repo("1.6.0")
    result = run(
        "rebase", "--onto", "1.6.0", "--git", remote.as_uri(), "--into", str(tmp_path / "w")
    )
    assert result.exit_code == 0, result.output
    assert rows(result.stdout) == {"jit": "refreshed", "extra": "clean"}
    both = run(
        "rebase", "--onto", "1.6.0", "--git", "x", "--source", ".", "--into", str(tmp_path / "v")
    )
    assert both.exit_code == 2 and "not both" in both.stderr


def test_a_tree_killed_before_its_state_was_written_is_started_again(
    fake_index, series_root, tmp_path
):
    """Killed after the new tree was moved to --into but before state.json: the tree
    carries the rebase's mark from before the move, so the next run replaces it."""
    from moe_patch import rebase, sources

    fake_index.add("1.0.0")
    add_release(fake_index, "1.1.0")
    into = tmp_path / "work"
    sources.from_cache("1.1.0", into, None, mark=lambda tree: rebase._state_dir(tree).mkdir())
    result = run("rebase", "--onto", "1.1.0", "--into", str(into))
    assert result.exit_code == 0, result.output
    assert git(into, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.1.0"


def test_rebase_marks_its_tree_before_moving_it_into_place(
    fake_index, series_root, tmp_path, monkeypatch
):
    from moe_patch import rebase, sources

    fake_index.add("1.0.0")
    add_release(fake_index, "1.1.0")
    marked_at_move = []
    move = sources._move_into_place

    def watched(tmp, into):
        marked_at_move.append(rebase._state_dir(tmp).is_dir())
        move(tmp, into)

    monkeypatch.setattr(sources, "_move_into_place", watched)
    result = run("rebase", "--onto", "1.1.0", "--into", str(tmp_path / "work"))
    assert result.exit_code == 0, result.output
    assert marked_at_move == [True]


def test_an_unmarked_foreign_tree_is_refused(fake_index, series_root, tmp_path):
    from moe_patch import sources

    fake_index.add("1.0.0")
    add_release(fake_index, "1.1.0")
    into = tmp_path / "work"
    sources.from_cache("1.1.0", into, None)
    before = tree_digest(into)
    result = run("rebase", "--onto", "1.1.0", "--into", str(into))
    assert result.exit_code == 2 and "exists and is not empty" in result.output
    assert tree_digest(into) == before


def test_writing_the_series_removes_what_a_killed_run_left(tmp_path):
    """A run killed between staging the new series directory and renaming it leaves
    ``.tmp-v<onto>-<pid>-*`` beside it; the next run that writes the series removes it
    (not a live run's)."""
    import subprocess
    import sys

    from moe_patch import rebase

    dead = subprocess.Popen([sys.executable, "-c", "pass"])  # a process id no longer alive
    dead.wait()
    left = tmp_path / f".tmp-v1.1.0-{dead.pid}-abcd1234"
    left.mkdir()
    (left / "series").write_text("half written\n")
    live = tmp_path / f".tmp-v1.1.0-{os.getpid()}-efgh5678"
    live.mkdir()
    rebase._write_series(tmp_path / "v1.1.0", {"series": b"x.patch\n"})
    assert (tmp_path / "v1.1.0" / "series").read_bytes() == b"x.patch\n"
    assert not left.exists() and live.exists()
