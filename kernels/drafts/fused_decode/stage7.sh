# Stages what run7.sh needs under .gpu/ (here, with network; ~5 min, mostly xz):
#   bash kernels/drafts/fused_decode/stage7.sh [RELEASE [WORKDIR]]     (RELEASE: 0.34.0)
# .gpu/bt/0 and .gpu/bt/1: two parts of the vLLM release's tree with its build (its wheel's
# extension modules); .gpu/bt/2: the last part, the manifest and the wheels of
# tests/release/gpu_branch_requirements.txt; .gpu/overlay: the series' vllm/ files.
# Then three consecutive calls to one warm device, carrying .gpu/bt/0, then .gpu/bt/1, then
# .gpu/bt/2 with .gpu/overlay and running `bash kernels/drafts/fused_decode/run7.sh`.
set -euo pipefail
release=${1:-0.34.0}
work=${2:-$(mktemp -d)}
repo=$(pwd)
py=$repo/.venv/bin/python
platform=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$py" - "$work" "$release" <<'PY'
import subprocess, sys
from pathlib import Path
from moe_patch import pr, sources
work, release = Path(sys.argv[1]), sys.argv[2]
tree = sources.from_cache(release, work / "vllm", None).path
for key, value in (("user.name", "moe-patch"), ("user.email", "moe-patch-gpu-pack@users.noreply.github.com")):
    subprocess.run(["git", "config", key, value], cwd=tree, check=True)
pr.prepare(tree, release, work / "prs", only=["swap-ab-split-k"], python=None)
PY
"$py" -m pip download -q --no-deps "${platform[@]}" "vllm==$release" -d "$work/wheel"
"$py" tests/release/gpu_branch_tests.py pack --source "$work/vllm" \
  --branch moe-patch/swap-ab-split-k --wheel "$work"/wheel/vllm-"$release"-*.whl \
  --out "$work/pack" --part-mib 46
rm -rf .gpu/bt && mkdir -p .gpu/bt/0 .gpu/bt/1 .gpu/bt/2 .gpu/overlay
cp "$work"/pack/*.part00 .gpu/bt/0/ && cp "$work"/pack/*.part01 .gpu/bt/1/
cp "$work"/pack/*.part02 "$work"/pack/manifest.json "$work"/pack/*.patch .gpu/bt/2/
"$py" -m pip download -q --no-deps "${platform[@]}" \
  -r tests/release/gpu_branch_requirements.txt -d .gpu/bt/2/whl
.venv/bin/moe-patch apply --vllm "$release" --into "$work/series" > /dev/null
(cd "$work/series" && git diff --name-only --diff-filter=AM "v$release" HEAD -- vllm/ \
  | tar -cf "$repo/.gpu/overlay/series-$release.tar" -T -)
du -sh .gpu/bt/* .gpu/overlay
