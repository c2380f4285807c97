# Stages what run7.sh needs under .gpu/ (here, with network; ~5 min, mostly xz):
#   bash kernels/drafts/fused_decode/stage7.sh [WORKDIR]
# .gpu/bt/0 and .gpu/bt/1: two parts of vLLM 0.33.0's tree with its build (its wheel's
# extension modules); .gpu/bt/2: the last part, the manifest and the wheels of
# tests/release/gpu_branch_requirements.txt; .gpu/overlay: the series' vllm/ files.
# Then three consecutive calls to one warm device, carrying .gpu/bt/0, then .gpu/bt/1, then
# .gpu/bt/2 with .gpu/overlay and running `bash kernels/drafts/fused_decode/run7.sh`.
set -euo pipefail
work=${1:-$(mktemp -d)}
repo=$(pwd)
py=$repo/.venv/bin/python
platform=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" - "$work" <<'PY'
import subprocess, sys
from pathlib import Path
from moe_patch import pr, sources
work = Path(sys.argv[1])
tree = sources.from_cache("0.33.0", work / "vllm", None).path
for key, value in (("user.name", "moe-patch"), ("user.email", "moe-patch@localhost")):
    subprocess.run(["git", "config", key, value], cwd=tree, check=True)
pr.prepare(tree, "0.33.0", work / "prs", only=["swap-ab-split-k"], python=None)
PY
"$py" -m pip download -q --no-deps "${platform[@]}" vllm==0.33.0 -d "$work/wheel"
"$py" tests/release/gpu_branch_tests.py pack --source "$work/vllm" \
  --branch moe-patch/swap-ab-split-k --wheel "$work"/wheel/vllm-0.33.0-*.whl \
  --out "$work/pack" --part-mib 46
rm -rf .gpu/bt && mkdir -p .gpu/bt/0 .gpu/bt/1 .gpu/bt/2 .gpu/overlay
cp "$work"/pack/*.part00 .gpu/bt/0/ && cp "$work"/pack/*.part01 .gpu/bt/1/
cp "$work"/pack/*.part02 "$work"/pack/manifest.json "$work"/pack/*.patch .gpu/bt/2/
"$py" -m pip download -q --no-deps "${platform[@]}" \
  -r tests/release/gpu_branch_requirements.txt -d .gpu/bt/2/whl
.venv/bin/moe-patch apply --vllm 0.33.0 --into "$work/series" > /dev/null
(cd "$work/series" && git diff --name-only --diff-filter=AM HEAD~7 HEAD -- vllm/ \
  | tar -cf "$repo/.gpu/overlay/series-0.33.0.tar" -T -)
du -sh .gpu/bt/* .gpu/overlay
