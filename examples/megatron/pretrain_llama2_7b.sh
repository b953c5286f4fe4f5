#!/bin/bash

# Llama-2-7B pretraining with a 32k context on 2 nodes x 8 H100 (DP=8 x TP=2 with sequence
# parallelism, distributed optimizer, no activation recompute).
#
# Written for ndplan's examples, not copied from anywhere: it is shaped after the launch
# scripts of NVIDIA/Megatron-LM, examples/gpt3/train_gpt3_175b_distributed.sh and
# examples/llama/train_llama3_8b_h100_fp8.sh (torchrun DISTRIBUTED_ARGS, bash arrays of
# flags, `torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${GPT_MODEL_ARGS[@]} ...`).
# Every flag is one of megatron/training/arguments.py (Megatron-LM core_v0.15.0).
#
# `ndplan check examples/megatron/pretrain_llama2_7b.sh --top 3` finds that it does not fit
# in 80 GiB (the activations of 32k tokens) and proposes the nearest strategies that do.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
NNODES=2
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

CHECKPOINT_PATH=${1:-"checkpoints/llama2_7b_32k"}
TENSORBOARD_LOGS_PATH=${2:-"tensorboard_logs/llama2_7b_32k"}
TOKENIZER_MODEL=${3:-"tokenizer.model"}  # the Llama-2 SentencePiece model
DATA_PATH=${4:-"llama2_text_document"}   # <path and file prefix>_text_document

TP_SIZE=2
PP_SIZE=1
CP_SIZE=1
MICRO_BATCH_SIZE=1
GLOBAL_BATCH_SIZE=64     # 64 x 32k = 2M tokens per step
SEQ_LENGTH=$((32*1024))  # Llama-2 was trained at 4096; RoPE positions up to SEQ_LENGTH

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

# Llama-2-7B: 32 layers, hidden 4096, 32 heads (MHA), SwiGLU 11008, RMSNorm, RoPE,
# no biases, untied input and output embeddings, 32000-token vocabulary.
GPT_MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 11008
    --num-attention-heads 32
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope
    --rotary-base 10000
    --normalization RMSNorm
    --norm-epsilon 1e-5
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --init-method-std 0.02
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-iters 50000
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --clip-grad 1.0
    --bf16
    --lr 3.0e-4
    --lr-decay-style cosine
    --min-lr 3.0e-5
    --lr-warmup-iters 2000
    --lr-decay-iters 50000
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --pipeline-model-parallel-size $PP_SIZE
    --context-parallel-size $CP_SIZE
    --sequence-parallel
)

DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model $TOKENIZER_MODEL
    # Megatron takes the vocabulary size from the tokenizer; stated for readers of this file
    --vocab-size 32000
    --split 949,50,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 10
    --log-throughput
    --save-interval 1000
    --eval-interval 1000
    --eval-iters 10
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --ckpt-format torch_dist
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
    --distributed-timeout-minutes 60
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DDP_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
