# Llama 3 405B as Meta trained it (Dubey et al. 2024, The Llama 3 Herd of Models, sec. 3.3):
# 16,384 H100, TP8 CP1 PP16 DP128, seq 8192, 16M-token batches (2048 sequences), bf16,
# interleaved pipeline with one layer fewer on the first and the last stage.
torchrun --nnodes 2048 --nproc-per-node 8 pretrain_gpt.py \
  --num-layers 126 --hidden-size 16384 --ffn-hidden-size 53248 --num-attention-heads 128 \
  --group-query-attention --num-query-groups 8 --vocab-size 128256 --swiglu --normalization RMSNorm \
  --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
  --attention-dropout 0 --hidden-dropout 0 \
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --sequence-parallel \
  --num-virtual-stages-per-pipeline-rank 2 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split \
  --micro-batch-size 1 --global-batch-size 2048 --seq-length 8192 --max-position-embeddings 8192 \
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap --bf16
