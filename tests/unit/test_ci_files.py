"""The CI files run the same verify command the README documents."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_github_matrix_runs_verify_per_release():
    text = (ROOT / ".github" / "workflows" / "verify.yml").read_text()
    assert "moe-patch verify --list" in text
    assert "fromJSON(needs.releases.outputs.releases)" in text
    assert "moe-patch verify --vllm ${{ matrix.vllm }}" in text
    # The kernel tests run there too, installed as .ci/run installs them.
    assert "python -m pytest tests/kernels" in text
    assert "python -m pytest tests/e2e" in text  # the e2e benchmark's tests without a GPU
    assert "pip install -e '.[test]' -c .ci/constraints.txt" in text


def test_local_ci_runs_verify_over_every_release():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/moe-patch verify" in lines


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    """The README's first screen has two commands; .ci/run runs the test one verbatim."""
    readme = (ROOT / "README.md").read_text().split("\n## ", 1)[0]
    commands = [
        line.strip() for line in readme.splitlines() if line.startswith("    python3 -m venv")
    ]
    assert len(commands) == 2, commands
    assert "moe-patch apply --vllm" in commands[0]
    assert commands[1] in (ROOT / ".ci" / "run").read_text().splitlines()
