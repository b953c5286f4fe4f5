#!/bin/bash
# Written for ndplan's tests in the shape of NVIDIA/Megatron-LM
# examples/multimodal/pretrain_mistral_clip.sh @ d98e8a64 (LLaVA pretraining: the vision encoder
# and the language model frozen, only the projection trained; --seq-length is the image
# embeddings, --decoder-seq-length the language model's sequence).
export CUDA_DEVICE_MAX_CONNECTIONS=1
BZ=256
OPTIONS=" \
    --use-te \
    --normalization RMSNorm \
    --group-query-attention \
    --num-query-groups 8 \
    --untie-embeddings-and-output-weights \
    --swiglu \
    --tensor-model-parallel-size 4 \
    --pipeline-model-parallel-size 1 \
    --num-layers 32 \
    --hidden-size 4096 \
    --num-attention-heads 32 \
    --seq-length 576 \
    --decoder-seq-length 1024 \
    --max-position-embeddings 4096 \
    --ffn-hidden-size 14336 \
    --micro-batch-size 1 \
    --global-batch-size ${BZ} \
    --tokenizer-type MultimodalTokenizer \
    --bf16 \
    --freeze-LM \
    --freeze-ViT \
    --patch-dim 14 \
    --img-h 336 \
    --img-w 336 \
    --language-model-type=mistral_7b \
"
torchrun --nproc_per_node 8 examples/multimodal/train.py ${OPTIONS}
