# v7 on the device without vLLM: check_v3 and diag_small (the small cases' stages), then
# bench.py's v5/v6/v7 configs beside the series' two GEMMs (the harness tree under .gpu/trees).
#   bash kernels/drafts/fused_decode/run8.sh [SECONDS]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
python3 $d/check_v3.py v7 2>&1 | tee "$OUT/check-v7.txt"
python3 $d/diag_small.py v6 2>&1 | tee "$OUT/diag-small.txt"
timeout "${1:-240}" python3 $d/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes deepseek-v3-tp8,qwen3-30b-a3b,minimax-m2-tp4,mixtral-8x7b --M 1,16 --quant tensor \
  --configs 12,18,21,22,23,24 --replays 10 --out "$OUT/fused-sweep-v7.json" 2>&1 \
  | tee "$OUT/fused-sweep-v7.log" | grep -v Warning
