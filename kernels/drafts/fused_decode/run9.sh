# The engine with the fused-decode draft (engine_check.py), on the device: the scratch of
# run7.sh (its venv, and the series tree with .gpu/overlay/fused-RELEASE.tar laid over it),
# then, per FP8 kind in KINDS, an eager engine whose fused calls are checked against the
# unfused path and float64, and an engine with CUDA graphs.
#   KINDS="fp8-block fp8-dynamic" bash kernels/drafts/fused_decode/run9.sh [SECONDS per engine]
set -o pipefail
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
bash kernels/drafts/fused_decode/run7.sh 0 none || exit 1
scratch="${TMPDIR:-/tmp}/run7"
[ -d "$scratch/fused" ] || { echo "run9.sh: no fused tree: stage .gpu/overlay/fused-*.tar" >&2; exit 2; }
status=0
for kind in ${KINDS:-fp8-block fp8-dynamic}; do
  for mode in eager graphs; do
    echo "== $kind $mode"
    PYTHONPATH="$scratch/fused" timeout "${1:-240}" "$scratch/venv/bin/python" \
      kernels/drafts/fused_decode/engine_check.py --kind "$kind" --mode "$mode" \
      --out "$OUT/engine-$kind-$mode.json" > "$OUT/engine-$kind-$mode.log" 2>&1 || status=1
    grep -v Warning "$OUT/engine-$kind-$mode.log" | tail -n 15
  done
done
exit $status
