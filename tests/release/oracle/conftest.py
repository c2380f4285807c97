"""Oracle tier: the real ``select_fp8_moe_backend`` of patched release trees.

For each release in ``MOE_PATCH_ORACLE_VERSIONS`` (comma-separated; default
0.21.0, 0.33.0 and 0.34.0: a release of each series) the session makes two
trees with moe-patch itself, the whole series ("patched") and the series without ``backend-selector``
and the patches that depend on it (``Upstream-Depends``: ``fp8-moe-backend-env``)
("upstream"), builds or reuses the release's cached environment (venvs.py),
and runs driver.py four times in parallel: each tree with and without
FlashInfer.  Tests then only read the answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import scenarios
import venvs
from moe_patch import series
from moe_patch.commands.apply import apply
from moe_patch.upstreaming import upstreaming

PATCH_ID = "backend-selector"
DRIVER = Path(__file__).with_name("driver.py")
VERSIONS = [
    v.strip()
    for v in os.environ.get("MOE_PATCH_ORACLE_VERSIONS", "0.21.0,0.33.0,0.34.0").split(",")
    if v.strip()
]
TIMINGS: list[str] = []


@dataclass
class Oracle:
    version: str
    env: venvs.Env
    trees: dict[str, Path]  # "patched": the whole series; "upstream": without the selector
    # answers[(tree, flashinfer)][scenario id]; tree is "patched" or "upstream"
    answers: dict[tuple[str, bool], dict[str, dict]] = field(default_factory=dict)

    def get(self, tree: str, flashinfer: bool, scenario: dict) -> dict:
        return self.answers[(tree, flashinfer)][scenario["id"]]


def without_selector(patches) -> list[str]:
    """The series' ids less backend-selector and every patch that depends on it."""
    left_out = {PATCH_ID}
    for patch in patches:  # a dependency comes earlier in the series
        if set(upstreaming(patch).depends) & left_out:
            left_out.add(patch.id)
    return [p.id for p in patches if p.id not in left_out]


def _trees(version: str, root: Path) -> dict[str, Path]:
    patches = series.for_version(version).patches
    ids = [p.id for p in patches]
    assert PATCH_ID in ids, f"{PATCH_ID} is not in the series serving {version}: {ids}"
    made = {}
    for name, only in (("patched", None), ("upstream", without_selector(patches))):
        report = apply(version, into=root / name, only=only)
        statuses = {o.id: o.status for o in report.outcomes}
        assert all(s != "failed" for s in statuses.values()), statuses
        made[name] = root / name
    return made


def _run_driver(env: venvs.Env, tree: Path, flashinfer: bool, work: Path) -> dict:
    request = work / f"request-{tree.name}-{flashinfer}.json"
    answer = work / f"answer-{tree.name}-{flashinfer}.json"
    request.write_text(
        json.dumps({"flashinfer": flashinfer, "scenarios": scenarios.all_scenarios()})
    )
    environ = {
        k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON", "CUDA_"))
    }
    environ.update(PYTHONPATH=str(tree), CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="INFO")
    done = subprocess.run(
        [str(env.python), str(DRIVER), str(request), str(answer)],
        cwd=work,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise RuntimeError(
            f"driver failed in {tree} (flashinfer={flashinfer}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-6000:]}"
        )
    return json.loads(answer.read_text())


_ORACLES: dict[str, Oracle] = {}


@pytest.fixture(scope="session", params=VERSIONS)
def oracle(request, tmp_path_factory) -> Oracle:
    version = request.param
    if version in _ORACLES:
        return _ORACLES[version]
    work = tmp_path_factory.mktemp(f"oracle-{version}")
    started = time.perf_counter()
    trees = _trees(version, work)
    env = venvs.oracle_env(trees["patched"])
    built = (
        f"built in {env.built_seconds:.0f} s"
        if env.built_seconds is not None
        else f"reused (built in {env.info.get('build_seconds', '?')} s)"
    )
    env_done = time.perf_counter()
    result = Oracle(version, env, trees)
    jobs = [(t, fi) for t in ("patched", "upstream") for fi in (True, False)]
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = {job: pool.submit(_run_driver, env, trees[job[0]], job[1], work) for job in jobs}
        for job, future in futures.items():
            result.answers[job] = future.result()
    TIMINGS.append(
        f"oracle {version}: environment {env.path.name} {built} (torch {env.info['torch']}); "
        f"trees + environment {env_done - started:.0f} s; "
        f"{len(jobs)} driver runs x {len(scenarios.all_scenarios())} scenarios "
        f"{time.perf_counter() - env_done:.0f} s"
    )
    _ORACLES[version] = result
    return result


def pytest_terminal_summary(terminalreporter):
    for line in TIMINGS:
        terminalreporter.write_line(line)
