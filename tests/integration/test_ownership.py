"""Whose tree is it: moe-patch changes a tree only on evidence it wrote itself.

A tree is moe-patch's when the state record moe-patch keeps in its git directory names that
very tree and the release commit it was made from.  Anything else (a clone of the user's own,
a checkout given as both --source and --into, a git worktree) is the user's: refused in one
line that says what to do, untouched, or patched on a new branch with --in-place, and said so.
"""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner
from moe_patch.cli import main
from support import git, release_checkout, tree_digest


def run(*args):
    return CliRunner().invoke(main, list(args))


def apply_json(*args):
    result = run("apply", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _my_clone(path):
    """A user's vLLM clone: the release tagged v1.0.0 and their own commit on main."""
    clone = release_checkout(path)
    (clone / "mine.py").write_text("mine = 1\n")
    git(clone, "add", "mine.py")
    git(clone, "commit", "-q", "-m", "my own work")
    return clone


def test_a_users_own_clone_is_refused_and_untouched(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    clone = _my_clone(tmp_path / "clone")
    before, head = tree_digest(clone), git(clone, "rev-parse", "HEAD")
    result = run("apply", "--vllm", "1.0.0", "--into", str(clone))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: {clone} is a git checkout moe-patch did not make; give another "
        f"--into, or patch it on a new branch with --source {clone} --in-place\n"
    )
    assert tree_digest(clone) == before  # no branch, no state file, same checkout
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git(clone, "rev-parse", "HEAD") == head


def test_source_and_into_one_checkout_needs_in_place(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    source = release_checkout(tmp_path / "src")
    main_head, before = git(source, "rev-parse", "main"), tree_digest(source)
    result = run("apply", "--vllm", "1.0.0", "--source", str(source), "--into", str(source))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: --source and --into are both {source}: moe-patch patches a copy "
        "of --source in a new --into, or the checkout itself on a new branch with --in-place\n"
    )
    assert tree_digest(source) == before

    # With --in-place: a new branch, and the switch is said, never silent.
    result = run("apply", "--vllm", "1.0.0", "--source", str(source), "--in-place")
    assert result.exit_code == 0, result.output
    assert (
        f"moe-patch: {source}: switched from branch main to moe-patch/v1.0.0 "
        "(git switch main goes back)\n"
    ) in result.stderr
    assert git(source, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
    assert git(source, "rev-parse", "main") == main_head  # the user's branch is as it was


def test_the_tree_moe_patch_made_is_updated_and_a_copy_of_it_is_not(
    fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    made = tmp_path / "made"
    apply_json("--vllm", "1.0.0", "--into", str(made))
    assert apply_json("--vllm", "1.0.0", "--into", str(made))["unchanged"] is True
    copy = tmp_path / "copy"
    shutil.copytree(made, copy, symlinks=True)
    result = run("apply", "--vllm", "1.0.0", "--into", str(copy))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: {copy} holds the record of the tree moe-patch made at {made} "
        "(it was moved or copied); move it back, or give a new --into\n"
    )


def test_a_branch_made_in_the_main_worktree_is_not_foreign_in_a_linked_one(
    fake_index, series_root, tmp_path
):
    fake_index.add("1.0.0")
    made = tmp_path / "made"
    apply_json("--vllm", "1.0.0", "--into", str(made))
    linked = tmp_path / "linked"
    git(made, "worktree", "add", "-q", "--detach", str(linked), "v1.0.0")

    # The linked worktree is not a tree moe-patch made: it says which one is.
    result = run("apply", "--vllm", "1.0.0", "--into", str(linked))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: {linked} is a git worktree of {made}, which moe-patch made; apply "
        f"--into {made}, or patch this worktree on a new branch with --source {linked} "
        "--in-place\n"
    )
    # In place, while the main worktree has the branch checked out: that is the reason given.
    result = run("apply", "--vllm", "1.0.0", "--source", str(linked), "--in-place")
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: branch moe-patch/v1.0.0 is checked out in {made}, another work "
        f"tree of {linked}'s repository; apply --into {made}, or switch that tree to another "
        "branch\n"
    )
    # Once it is not: the branch moe-patch made is moe-patch's here too, and nothing changes.
    git(made, "switch", "-q", "-c", "mine")
    report = apply_json("--vllm", "1.0.0", "--source", str(linked), "--in-place")
    assert report["unchanged"] is True
    assert git(linked, "rev-parse", "--abbrev-ref", "HEAD") == "moe-patch/v1.0.0"
    assert git(linked, "status", "--porcelain") == ""


def test_a_tree_an_earlier_moe_patch_made_is_still_updated(fake_index, series_root, tmp_path):
    """State records written before this check name no tree: their release commit is the
    evidence, and the next write names the tree."""
    fake_index.add("1.0.0")
    made = tmp_path / "made"
    apply_json("--vllm", "1.0.0", "--into", str(made))
    record = made / ".git" / "moe-patch-state.json"
    state = json.loads(record.read_text())
    del state["tree"]
    record.write_text(json.dumps(state))
    assert apply_json("--vllm", "1.0.0", "--into", str(made))["unchanged"] is True
    assert json.loads(record.read_text())["tree"] == str(made)


def test_a_checkout_tree_is_not_applied_into(fake_index, series_root, tmp_path):
    fake_index.add("1.0.0")
    tree = tmp_path / "edit"
    assert run("checkout", "--vllm", "1.0.0", str(tree)).exit_code == 0
    head = git(tree, "rev-parse", "HEAD")
    result = run("apply", "--vllm", "1.0.0", "--into", str(tree))
    assert result.exit_code == 7, result.output
    assert result.stderr == (
        f"moe-patch: error: {tree} is a tree for editing the series (moe-patch checkout or "
        "rebase), not one apply made; give apply another --into\n"
    )
    assert git(tree, "rev-parse", "HEAD") == head
