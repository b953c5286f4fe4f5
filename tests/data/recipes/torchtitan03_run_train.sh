#!/usr/bin/bash
# Written for ndplan's tests in the shape of pytorch/torchtitan run_train.sh @ b5bcd76c66d0acb1a08b176d9639425bc55e0b2a
# (torchtitan >= 0.3: a registered config and CLI overrides; "$@" written out here).
set -ex
NGPU=${NGPU:-"8"}
export LOG_RANK=${LOG_RANK:-0}
MODULE=${MODULE:-"llama3"}
CONFIG=${CONFIG:-"llama3_8b"}
PYTORCH_ALLOC_CONF="expandable_segments:True" \
torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" \
--local-ranks-filter ${LOG_RANK} --role rank --tee 3 \
-m torchtitan.train --module ${MODULE} --config ${CONFIG} \
    --parallelism.tensor_parallel_degree 2 \
    --training.global_batch_size 32 \
    activation_checkpoint:full
