# One device call (~150 s): v6 checked on the GPU, then v5's pipeline depth (SWEEP 14-17) and
# v6 (18-20) against v5's measured best (12) and the series' two GEMMs on four shapes.
# .gpu/trees from: python -m moe_patch.harness_trees 0.21.0+moe --out .gpu/trees
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv
python3 kernels/drafts/fused_decode/check_v3.py v6 2>&1 | tee $OUT/check.txt
timeout ${1:-300} python3 kernels/drafts/fused_decode/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,mixtral-8x7b \
  --M 1,16 --quant tensor,block --routings 1 --configs 12,14,15,16,17,18,19,20 --replays 10 \
  --out $OUT/fused-sweep-v6.json 2>&1 | tee $OUT/log.txt
