# v12 on the device, and the grain: v12 checked (check_v3.py, graph_check.py: each under a
# time limit, since a wait that never ended would hang), then bench.py with v9, v9 and v11
# split to 16-32 KB a program, and v12 at 32, 16 and 64 KB units; the read probe beside.
#   bash kernels/drafts/fused_decode/run14.sh [SECONDS] [SHAPES] [M] [QUANT]
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
d=kernels/drafts/fused_decode
shapes="${2:-qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4}"
(timeout 60 python3 $d/check_v3.py v12; echo "check_v3 rc=$?"
 timeout 60 python3 $d/graph_check.py qwen3-30b-a3b,deepseek-v3-tp8 1,16 v12
 echo "graph_check rc=$?") 2>&1 | grep -v Warning | tee "$OUT/check-graph-v12.txt"
grep -q "check_v3 rc=0" "$OUT/check-graph-v12.txt" || exit 1
timeout "${1:-240}" python3 $d/bench.py --shapes "$shapes" --M "${3:-1,2,4,8,16}" \
  --quant "${4:-tensor,block}" --configs 32,45,47,48,49,50 --replays 10 \
  --out "$OUT/fused-sweep-v12.json" 2>&1 | grep -v Warning
timeout "${1:-240}" python3 $d/read_probe.py --shapes "$shapes" --M "${3:-1,2,4,8,16}" \
  --chunk-kb 16,32 --configs 32,48 --out "$OUT/read-probe-v12.json" 2>&1 | grep -v Warning
