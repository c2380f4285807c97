# On the GPU machine, once every part of the pack is there (gpu_branch_tests.py's docstring):
# the GPU-only tests of moe-patch pr's branches, on their base and on them.
#   bash tests/release/gpu_branch_tests.sh [SECONDS]     (.gpu/bt/*/: the parts; whl/: the wheels)
set -o pipefail
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
manifests=$(find .gpu/bt -maxdepth 2 -name manifest.json | wc -l)
if [ "$manifests" -ne 1 ]; then
  echo "gpu_branch_tests.sh: $manifests packs under .gpu/bt/, need exactly one: carry one release's pack" >&2
  exit 2
fi
scratch=$(mktemp -d) || exit 1
python3 -m venv "$scratch/venv" || exit 1
venv_python="$scratch/venv/bin/python"
# The image's python3 is itself a venv's: its packages join the new one through a .pth, after
# the carried wheels (--system-site-packages would give the base interpreter's instead).
python3 -c 'import site; print(site.getsitepackages()[0])' \
  > "$("$venv_python" -c 'import site; print(site.getsitepackages()[0])')/image.pth"
"$venv_python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  .gpu/bt/*/whl/*.whl || exit 1
mkdir "$scratch/packed" && find .gpu/bt -maxdepth 2 -type f \
  \( -name 'tree-*' -o -name '*.patch' -o -name manifest.json \) \
  -exec cp {} "$scratch/packed/" \; || exit 1
mkdir -p "$OUT/branch-tests"
PYTHONPATH=tooling timeout "${1:-420}" "$venv_python" tests/release/gpu_branch_tests.py run \
  --packed "$scratch/packed" --python "$venv_python" --out "$OUT/branch-tests" 2>&1 \
  | tee "$OUT/branch-tests/log.txt"
