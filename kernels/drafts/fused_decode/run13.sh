# One call of a chain to one warm machine: stage the e2e bundle's parts carried in this
# call (.gpu/e2e/N/, as run10.sh does), then v9 kernel by kernel (kernel_split.py) and the
# read probe beside v9 (read_probe.py: the simplest kernel reading the same bytes, one
# launch and two), each under its own time limit; v11 (v9 with TMA weight loads) checked
# first (check_v3.py, graph_check.py) and measured beside v9.
#   bash kernels/drafts/fused_decode/run13.sh [SECONDS] [SHAPES] [M]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
for parts in .gpu/e2e/*/; do
  [ -d "$parts" ] && PYTHONPATH=kernels python3 -m moe_e2e.stage --parts "$parts" \
    --into "${TMPDIR:-/tmp}/moe-e2e"
done
python3 $d/check_v3.py v11 2>&1 | grep -v Warning
python3 $d/graph_check.py qwen3-30b-a3b,deepseek-v3-tp8 1,4,16 v11 2>&1 | grep -v Warning
shapes="${2:-qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,qwen3-235b-a22b,mixtral-8x7b}"
timeout "${1:-200}" python3 $d/kernel_split.py --shapes "$shapes" --M "${3:-1,4,16}" \
  --quant tensor --configs 32,40,41,42,43 --out "$OUT/kernel-split-v9.json" 2>&1 | grep -v Warning
timeout "${1:-200}" python3 $d/read_probe.py --shapes "$shapes" --M "${3:-1,4,16}" \
  --configs 32,42,43 --out "$OUT/read-probe.json" 2>&1 | grep -v Warning
