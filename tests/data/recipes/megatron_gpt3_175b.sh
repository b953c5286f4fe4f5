#!/bin/bash
# Written for ndplan's tests in the shape of NVIDIA/Megatron-LM
# examples/gpt3/train_gpt3_175b_distributed.sh @ d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (GPT-3 175B with the GPT-2 BPE tokenizer, here with interleaved pipeline stages).
GPUS_PER_NODE=8
NUM_NODES=${NUM_NODES:-16}
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --bf16
    --recompute-activations
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 16
    --num-layers-per-virtual-pipeline-stage 3
    --use-distributed-optimizer
    --sequence-parallel
)
DATA_ARGS=(
    --tokenizer-type GPT2BPETokenizer
    --vocab-file gpt2-vocab.json
    --merge-file gpt2-merges.txt
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]}
