set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv
timeout ${1:-120} python3 kernels/drafts/fused_decode/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,mixtral-8x7b \
  --M 1,4,16 --quant tensor --routings 1 --configs 0,1,2 --replays 10 \
  --out $OUT/fused-sweep-v3.json 2>&1 | tee $OUT/log.txt
