# A vLLM release's own layer (fused_experts, its C++ glue) against the fused forms, as released and
# with the series, on the device (vllm_layer.py), from what stage7.sh put under .gpu/ (the
# release is the pack's: its manifest names the base).
#   bash kernels/drafts/fused_decode/run7.sh [SECONDS per tree] [TREES: release,series|none] [CONFIGS]
# (SHAPES, QUANT, MS and ROUTING in the environment narrow or widen the cases.)
# The venv and trees stay in run7/ of the temporary directory for the next call to the
# same warm machine.
set -o pipefail
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
nvidia-smi --query-gpu=name --format=csv,noheader
manifests=$(find .gpu/bt -maxdepth 2 -name manifest.json | wc -l)
if [ "$manifests" -ne 1 ]; then
  echo "run7.sh: $manifests packs under .gpu/bt/, need exactly one: carry one release's pack" >&2
  exit 2
fi
release=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))
print(m["branches"][0]["parent_describe"].lstrip("v"))' .gpu/bt/*/manifest.json) || exit 1
overlay=.gpu/overlay/series-$release.tar
[ -f "$overlay" ] || { echo "run7.sh: no $overlay: run stage7.sh $release" >&2; exit 2; }
scratch="${TMPDIR:-/tmp}/run7"
if [ ! -f "$scratch/ready" ]; then
rm -rf "$scratch" && mkdir -p "$scratch" || exit 1
python3 -m venv "$scratch/venv" || exit 1
py="$scratch/venv/bin/python"
python3 -c 'import site; print(site.getsitepackages()[0])' \
  > "$("$py" -c 'import site; print(site.getsitepackages()[0])')/image.pth"
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .gpu/bt/*/whl/*.whl || exit 1
mkdir "$scratch/packed" && find .gpu/bt -maxdepth 2 -type f \
  \( -name 'tree-*' -o -name '*.patch' -o -name manifest.json \) \
  -exec cp {} "$scratch/packed/" \; || exit 1
PYTHONPATH=tooling:tests/release "$py" - "$scratch" <<'PY' || exit 1
import json, sys
from pathlib import Path
import gpu_branch_tests as g
scratch = Path(sys.argv[1])
entry = json.loads((scratch / "packed" / "manifest.json").read_text())["branches"][0]
repo, base, _ = g._rebuild(scratch / "packed", entry, scratch)
g.git(repo, "checkout", "-q", base)
PY
mv "$scratch/vllm" "$scratch/release" && cp -a "$scratch/release" "$scratch/series" \
  && tar -xf "$overlay" -C "$scratch/series" && touch "$scratch/ready" || exit 1
fi
py="$scratch/venv/bin/python"
# The series with the fused-decode draft too, where an overlay for it was staged.
fused=.gpu/overlay/fused-$release.tar
if [ -f "$fused" ] && [ ! -d "$scratch/fused" ]; then
  cp -a "$scratch/series" "$scratch/fused.tmp" && tar -xf "$fused" -C "$scratch/fused.tmp" \
    && mv "$scratch/fused.tmp" "$scratch/fused" || exit 1
fi
trees=${2:-release,series}
[ "$trees" = none ] && exit 0
for tree in ${trees//,/ }; do
  PYTHONPATH="$scratch/$tree" timeout "${1:-200}" "$py" kernels/drafts/fused_decode/vllm_layer.py \
    --label "$release-$tree" --shapes "${SHAPES:-qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,mixtral-8x7b}" \
    --M "${MS:-1,4,16}" --quant "${QUANT:-tensor,block}" --routing "${ROUTING:-uniform,shared}" \
    --configs "${3:-18,32}" --out "$OUT/vllm-layer-$tree.json" 2>&1 \
    | tee "$OUT/vllm-layer-$tree.log" | grep -v Warning
done
