"""moe-patch against another process changing what it reads: git's gc repacking a --source
checkout while moe-patch clones it."""

import subprocess
import sys
from pathlib import Path

from support import release_checkout


def test_a_source_repacked_while_moe_patch_clones_it(fake_index, series_root, tmp_path):
    """git's gc on the user's --source, running while moe-patch clones it, moves objects
    between loose files and packs: each apply either succeeds or fails in one line with a
    documented exit code, and never leaves a partial --into behind."""
    import threading

    source = release_checkout(tmp_path / "src", notes=40)  # loose objects for gc to pack
    stop = threading.Event()

    def gc_forever():
        while not stop.is_set():
            for args in (
                ["repack", "-a", "-d", "-q"],
                ["prune-packed"],
                ["gc", "-q", "--prune=now"],
            ):
                subprocess.run(["git", *args], cwd=source, capture_output=True, check=False)

    worker = threading.Thread(target=gc_forever, daemon=True)
    worker.start()
    outcomes = []
    try:
        for attempt in range(6):
            into = tmp_path / f"t-{attempt}"
            proc = subprocess.run(
                [str(Path(sys.executable).parent / "moe-patch"), "apply", "--vllm", "1.0.0",
                 "--source", str(source), "--into", str(into)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            outcomes.append(proc.returncode)
            if proc.returncode == 0:
                assert (into / ".git").is_dir()
                continue
            assert proc.returncode in (2, 4, 7, 11), proc.stderr
            assert "Traceback" not in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert not into.exists()
    finally:
        stop.set()
        worker.join()
    assert 0 in outcomes  # the check is not vacuous: applies got through while gc ran
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
