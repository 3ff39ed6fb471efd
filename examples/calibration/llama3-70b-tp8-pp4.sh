#!/bin/bash
# SYNTHETIC EXAMPLE for `planner calibrate` (see README.md here): the launch of the example log.
# Llama-3-70B shape on 16 DGX H100 nodes: TP 8 inside a node, PP 4, DP 4, Megatron-LM pretrain_gpt.py.
GPUS_PER_NODE=8
NNODES=16
export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc-per-node $GPUS_PER_NODE --nnodes $NNODES --node-rank ${SLURM_NODEID:-0} \
    --master-addr ${MASTER_ADDR:-localhost} --master-port 6000 \
    pretrain_gpt.py \
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --kv-channels 128 \
    --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 \
    --position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm \
    --disable-bias-linear --untie-embeddings-and-output-weights \
    --attention-dropout 0.0 --hidden-dropout 0.0 \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel \
    --micro-batch-size 1 --global-batch-size 512 --bf16 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --recompute-activations \
    --train-iters 5000 --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --lr-warmup-iters 200 \
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.008 \
    --log-interval 10 --log-throughput --log-device-memory-used --eval-interval 1000 --eval-iters 10 \
    --save-interval 500 --save /checkpoints/llama3-70b --load /checkpoints/llama3-70b \
    --data-path /data/llama3/text_document --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model meta-llama/Meta-Llama-3-70B
