#!/bin/bash
# Example Megatron-LM launch for `planner check` (README.md, docs/megatron.md): Llama 3 8B on
# 8 DGX H100 nodes (dgx-h100-x8), TP 2, DP 32, micro-batch 1, distributed optimizer,
# expandable segments. Verdict: INVALID (exit 1): the typo --num-querry-groups..
GPUS_PER_NODE=8
NNODES=8
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
    --group-query-attention --num-querry-groups 8 --kv-channels 128
    --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256
    --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm
    --disable-bias-linear --untie-embeddings-and-output-weights
    --attention-dropout 0.0 --hidden-dropout 0.0
)
PARALLEL_ARGS=(
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel
    --micro-batch-size 1 --global-batch-size 256 --bf16
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather
)
TRAINING_ARGS=(
    --train-iters 10000 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 500
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.02
    --log-interval 10 --save-interval 1000 --save /checkpoints/llama3-8b --load /checkpoints/llama3-8b
    --data-path /data/llama3/text_document --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Meta-Llama-3-8B
)

torchrun --nproc-per-node $GPUS_PER_NODE --nnodes $NNODES --node-rank ${SLURM_NODEID:-0} \
    --master-addr ${MASTER_ADDR:-localhost} --master-port 6000 \
    pretrain_gpt.py "${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${TRAINING_ARGS[@]}"
