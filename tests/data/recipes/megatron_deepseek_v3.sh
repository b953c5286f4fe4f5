#!/bin/bash
# Written for ndplan's tests in the shape of NVIDIA/Megatron-LM
# examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh @ d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (MLA, --moe-layer-freq pattern, a shared expert, MTP, HuggingFaceTokenizer, per-module recompute).
TP=${TP:-1}
EP=${EP:-8}
MBS=${MBS:-4}
GBS=${GBS:-2048}
SHARDING_STRATEGY=${SHARDING_STRATEGY:-"optim_grads_params"}
PRETRAIN_ARGS=(
    --tensor-model-parallel-size ${TP}
    --expert-model-parallel-size ${EP}
    --expert-tensor-parallel-size 1
    --context-parallel-size 1
    --use-distributed-optimizer
    --sequence-parallel
    --micro-batch-size ${MBS}
    --global-batch-size ${GBS}
    --recompute-granularity selective
    --recompute-modules mlp moe mla_up_proj layernorm
    --seq-length 4096
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model deepseek-ai/DeepSeek-V3
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --kv-channels 128
    --make-vocab-size-divisible-by 3232
    --swiglu
    --untie-embeddings-and-output-weights
    --multi-latent-attention
    --qk-layernorm
    --num-experts 256
    --moe-layer-freq [0]*3+[1]*58
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048
    --moe-router-topk 8
    --moe-token-dispatcher-type flex
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --mtp-num-layers 1
    --bf16
)
PRETRAIN_ARGS=(
    "${PRETRAIN_ARGS[@]}"
    --use-megatron-fsdp
    --data-parallel-sharding-strategy ${SHARDING_STRATEGY}
    --megatron-fsdp-main-grads-dtype bf16
)
srun python pretrain_gpt.py ${PRETRAIN_ARGS[@]}
