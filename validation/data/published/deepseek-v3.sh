# DeepSeek-V3 as DeepSeek-AI trained it (DeepSeek-V3 Technical Report, arXiv 2412.19437, sec. 3):
# 2,048 H800 (256 nodes of 8, InfiniBand across nodes), PP16 EP64 TP1 with ZeRO-1 data
# parallelism, sequence 4096, batch ramped to 15,360 sequences, fp8 (1x128 tile-wise: Megatron's
# blockwise recipe), node-limited routing (a token reaches at most 4 nodes) with DeepEP-style
# dispatch, computation/communication overlap of two micro-batches (DualPipe; here Megatron's
# --overlap-moe-expert-parallel-comm), RMSNorm and MLA up-projection recomputed, one MTP module.
# Megatron runs that overlap with pipelining only on a virtual pipeline (TransformerConfig
# asserts it), and DualPipe too holds two chunks per rank: 32 virtual stages of 1-2 layers
# (61 layers, embedding first, MTP and loss last). 15,360 / 128 = 120 micro-batches are not a
# multiple of PP 16, so the interleaved schedule groups them by 20 (120 mod 20 = 0, 20 >= 16).
torchrun --nnodes 256 --nproc-per-node 8 pretrain_gpt.py \
  --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128 \
  --vocab-size 129280 --swiglu --normalization RMSNorm --position-embedding-type rope \
  --untie-embeddings-and-output-weights --disable-bias-linear --qk-layernorm --attention-dropout 0 --hidden-dropout 0 \
  --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 \
  --moe-layer-freq '([0]*3+[1]*58)' --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-grouped-gemm \
  --moe-token-dispatcher-type flex --moe-router-dtype fp32 \
  --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 \
  --mtp-num-layers 1 \
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 16 --expert-model-parallel-size 64 \
  --pipeline-model-parallel-layout 'Et|(tt|)*29t|tmL' --microbatch-group-size-per-virtual-pipeline-stage 20 \
  --overlap-moe-expert-parallel-comm --delay-wgrad-compute \
  --micro-batch-size 1 --global-batch-size 15360 --seq-length 4096 --max-position-embeddings 4096 \
  --recompute-granularity selective --recompute-modules layernorm mla_up_proj \
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --bf16 --fp8-format e4m3 --fp8-recipe blockwise
