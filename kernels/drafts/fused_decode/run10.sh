# The fused-decode draft in a served engine, from an e2e bundle of vLLM 0.25.1 whose patched
# wheel carries the draft (the series copied with the draft appended to v0.25.0/series, then
# `MOE_PATCH_SERIES=COPY python -m moe_patch.harness_wheels --vllm 0.25.1 --platform
# manylinux_2_28_x86_64` and `python -m moe_e2e.bundle`; README says how). The parts come
# one per call to one warm machine, each in .gpu/e2e/N/ with bundle.json; every call stages
# what it finds, and once all are in, the kernel test vLLM would run
# (patches/upstream/tests/kernels/moe/test_fused_moe_decode.py), then engine_check.py per kind in
# KINDS, eager (each fused call checked against the unfused path and float64) and with
# CUDA graphs.
# UPSTREAM=0 leaves the kernel test out (it passed on the H100 of 2026-12-07:
# results/h100-upstream-test-0.25.1.log).
#   KINDS="fp8-dynamic fp8-block" bash kernels/drafts/fused_decode/run10.sh [SECONDS per engine]
set -o pipefail
export PYTHONUNBUFFERED=1
into="${TMPDIR:-/tmp}/moe-e2e"
for parts in .gpu/e2e/*/; do
  PYTHONPATH=kernels python3 -m moe_e2e.stage --parts "$parts" --into "$into" || exit 1
done
[ -f "$into/staged.json" ] || { echo "run10.sh: parts still to come"; exit 0; }
sites=$(python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["sites"]
print(s["patched"] + ":" + s["deps"])' "$into/staged.json") || exit 1
status=0
if [ "${UPSTREAM:-1}" != 0 ]; then
  echo "== the upstream kernel test"
  PYTHONPATH="$sites" timeout "${1:-240}" python3 -m pytest -q -p no:cacheprovider \
    patches/upstream/tests/kernels/moe/test_fused_moe_decode.py \
    > "$OUT/upstream-test.log" 2>&1 || status=1
  tail -n 15 "$OUT/upstream-test.log"
fi
for kind in ${KINDS:-fp8-dynamic fp8-block}; do
  for mode in eager graphs; do
    echo "== $kind $mode"
    PYTHONPATH="$sites:kernels" timeout "${1:-240}" python3 \
      kernels/drafts/fused_decode/engine_check.py --kind "$kind" --mode "$mode" \
      --out "$OUT/engine-$kind-$mode.json" > "$OUT/engine-$kind-$mode.log" 2>&1 || status=1
    grep -v Warning "$OUT/engine-$kind-$mode.log" | tail -n 15
  done
done
exit $status
