#!/bin/bash
# Written for ndplan's tests in the shape of microsoft/Megatron-DeepSpeed
# examples_deepspeed/MoE/ds_pretrain_gpt_350M_MoE128.sh @ f4157bea (DeepSpeed MoE: 128 experts
# in every second layer (--expert-interval default 2), top-1, capacity factor 1.0, fp16, ZeRO 0
# written into the DeepSpeed config by sed, no pipeline).
NUM_LAYERS=24
HIDDEN_SIZE=1024
NUM_ATTN_HEADS=16
SEQ_LEN=2048
EP_SIZE=128
EP_PARALLEL_SIZE=64
MOE_TRAIN_CAP_FACTOR=1.0
megatron_options=" \
        --tensor-model-parallel-size 1 \
        --moe-expert-parallel-size ${EP_PARALLEL_SIZE} \
        --num-experts ${EP_SIZE} \
        --moe-loss-coeff 0.01 \
        --moe-train-capacity-factor ${MOE_TRAIN_CAP_FACTOR} \
        --moe-min-capacity 4 \
        --micro-batch-size 4 \
        --global-batch-size 256 \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTN_HEADS} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings ${SEQ_LEN} \
        --fp16 \
        --checkpoint-activations \
        --create-moe-param-group"
sed "s/ZERO_STAGE/0/" ds_config_gpt_TEMPLATE.json > ds_config.json
deepspeed_options=" \
        --deepspeed \
        --deepspeed_config ds_config.json \
        --pipeline-model-parallel-size 1 \
        --no-pipeline-parallel"
deepspeed --num_gpus 8 --num_nodes 8 pretrain_gpt.py ${megatron_options} ${deepspeed_options}
