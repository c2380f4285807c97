# One device call (~300 s): v5 checked on the GPU, then v4's best and v5 against the series'
# two GEMMs on six shapes.  .gpu/trees from: python -m moe_patch.harness_trees 0.21.0+moe --out .gpu/trees
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv
python3 kernels/drafts/fused_decode/check_v3.py v5 2>&1 | tee $OUT/check.txt || exit 1
timeout ${1:-420} python3 kernels/drafts/fused_decode/bench.py --tree 0.21.0+moe=.gpu/trees/0.21.0+moe \
  --shapes qwen3-30b-a3b,deepseek-v3-tp8,minimax-m2-tp4,glm-4.5-air,mixtral-8x7b,llama-4-scout-tp2 \
  --M 1,4,16 --quant tensor,block --routings 1 --configs 1,6,9,10,11,12,13 --replays 10 \
  --out $OUT/fused-sweep-v5.json 2>&1 | tee $OUT/log.txt
