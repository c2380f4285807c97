# The fused forms on the device without vLLM: check_v3 for each form in CHECK (default v9; and
# diag_small's stages where DIAG=1), then bench.py's configs beside the series' two GEMMs (the
# harness tree under .gpu/trees) unless SECONDS is 0.
#   CHECK="v8 v9" bash kernels/drafts/fused_decode/run8.sh [SECONDS] [CONFIGS] [QUANT] [M]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
for form in ${CHECK:-v9}; do
  python3 $d/check_v3.py "$form" 2>&1 | tee "$OUT/check-$form.txt"
done
[ "${DIAG:-0}" = 1 ] && python3 $d/diag_small.py v6 2>&1 | tee "$OUT/diag-small.txt"
[ "${1:-240}" = 0 ] && exit 0
timeout "${1:-240}" python3 $d/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes deepseek-v3-tp8,qwen3-30b-a3b,minimax-m2-tp4,mixtral-8x7b --M "${4:-1,16}" \
  --quant "${3:-tensor}" --configs "${2:-12,18,21,22,23,24}" --replays 10 \
  --out "$OUT/fused-sweep-v7.json" 2>&1 | tee "$OUT/fused-sweep-v7.log" | grep -v Warning
