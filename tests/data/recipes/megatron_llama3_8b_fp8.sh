#!/bin/bash
# Written for ndplan's tests in the shape of NVIDIA/Megatron-LM
# examples/llama/train_llama3_8b_h100_fp8.sh @ d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (arrays with one quoted element per flag and value, ARRAY+=( ), ${1:-default}).
CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b_fp8"}
DTYPE=${DTYPE:-"fp8"}
SEQ_LENGTH=8192
DISTRIBUTED_ARGS=(
    --nproc_per_node 8
    --nnodes 1
)
MODEL_ARGS=(
    --use-mcore-models
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length $SEQ_LENGTH
    --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --bf16
    --grad-reduce-in-bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
DTYPE_ARGS=()
if [[ "$DTYPE" == "fp8" ]]; then
    DTYPE_ARGS+=(
        "--fp8-format hybrid"
        "--fp8-amax-history-len 1024"
        "--fp8-amax-compute-algo max"
        "--fp8-param-gather"
    )
fi
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --context-parallel-size 1
    --sequence-parallel
)
DATA_ARGS_LIST=(
    "--mock-data"
    "--tokenizer-type NullTokenizer"
    "--vocab-size 128256"
    "--split '99,1,0'"
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${DTYPE_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS_LIST[@]} \
    --save $CHECKPOINT_PATH
