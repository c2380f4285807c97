# v9 kernel by kernel (kernel_split.py: each kernel's device time against the bytes it
# reads), then bench.py's graph times for the same configs beside the series' two GEMMs
# (the harness tree under .gpu/trees): where the fused GEMMs lose the read rate at M <= 16.
#   bash kernels/drafts/fused_decode/run12.sh [SECONDS] [CONFIGS] [QUANT] [M] [SHAPES]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
shapes="${5:-qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4}"
configs="${2:-32,40,41}"
timeout "${1:-200}" python3 $d/kernel_split.py --shapes "$shapes" --M "${4:-1,4,16}" \
  --quant "${3:-tensor}" --configs "$configs" --out "$OUT/kernel-split.json" 2>&1 | grep -v Warning
timeout "${1:-200}" python3 $d/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes "$shapes" --M "${4:-1,4,16}" --quant "${3:-tensor}" --configs "$configs" \
  --replays 10 --out "$OUT/fused-sweep-v9-kernels.json" 2>&1 | grep -v Warning
