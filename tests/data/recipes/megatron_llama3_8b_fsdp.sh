#!/bin/bash
# Written for ndplan's tests in the shape of NVIDIA/Megatron-LM
# examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh @ d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (Megatron-FSDP with ${SHARDING_STRATEGY:-...}, an array extended with "${ARR[@]}").
USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1}
SHARDING_STRATEGY=${SHARDING_STRATEGY:-"optim_grads_params"}
MODEL_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --swiglu
    --untie-embeddings-and-output-weights
    --vocab-size 128256
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --bf16
)
if [ "${USE_MEGATRON_FSDP}" = 1 ]; then
    unset CUDA_DEVICE_MAX_CONNECTIONS
    TRAINING_ARGS=(
        "${TRAINING_ARGS[@]}"
        --use-megatron-fsdp
        --data-parallel-sharding-strategy ${SHARDING_STRATEGY}
        --no-gradient-accumulation-fusion
        --ckpt-format fsdp_dtensor
    )
fi
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --context-parallel-size 1
    --use-distributed-optimizer
)
torchrun --nproc_per_node 8 --nnodes 1 pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]}
