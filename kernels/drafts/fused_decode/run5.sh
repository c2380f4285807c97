# One device call (~150 s): v5 checked on the GPU, then three v5 configs against the series'
# two GEMMs on four shapes.  .gpu/trees from: python -m moe_patch.harness_trees 0.21.0+moe --out .gpu/trees
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv
python3 kernels/drafts/fused_decode/check_v3.py v5 2>&1 | tee $OUT/check.txt || exit 1
timeout ${1:-420} python3 kernels/drafts/fused_decode/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,mixtral-8x7b \
  --M 1,16 --quant tensor,block --routings 1 --configs 9,10,12 --replays 10 \
  --out $OUT/fused-sweep-v5.json 2>&1 | tee $OUT/log.txt
