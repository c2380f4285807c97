# v10 (one launch, stream-K phases) on the device: check_v3 for each form in CHECK (v10),
# graph_check.py (v10 captured and replayed; without the cooperative launch if that fails), then bench.py's
# v9 (32) beside v10 (35-39) and the series' two GEMMs (the harness tree under .gpu/trees),
# then diag9 (the emulation's division) and the staging of whatever e2e parts came along.
#   bash kernels/drafts/fused_decode/run11.sh [SECONDS] [CONFIGS] [QUANT] [M] [SHAPES]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
for form in ${CHECK:-v10}; do
  timeout 150 python3 $d/check_v3.py "$form" 2>&1 | tee "$OUT/check-$form.txt" | tail -n 14
done
configs="${2:-32,35,36,37,38,39}"
if ! timeout 120 python3 $d/graph_check.py qwen3-30b-a3b 1,4 2>&1 | tee "$OUT/graph-check.txt" | grep -v Warning; then
  configs=$(echo ",$configs," | sed 's/,35,/,/; s/^,//; s/,$//')  # bench captures graphs too
fi
timeout "${1:-240}" python3 $d/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes "${5:-deepseek-v3-tp8,qwen3-30b-a3b,minimax-m2-tp4,mixtral-8x7b}" --M "${4:-1,4,16}" \
  --quant "${3:-tensor,block}" --configs "$configs" --replays 10 \
  --out "$OUT/fused-sweep-v10.json" 2>&1 | tee "$OUT/fused-sweep-v10.log" | grep -v Warning
[ -n "$DIAG9" ] && timeout 120 python3 $d/diag9.py $DIAG9 2>&1 | tee "$OUT/diag9.txt"
for parts in .gpu/e2e/*/; do
  [ -d "$parts" ] && PYTHONPATH=kernels python3 -m moe_e2e.stage --parts "$parts" --into "${TMPDIR:-/tmp}/moe-e2e"
done
exit 0
