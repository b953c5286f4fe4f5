#!/usr/bin/bash
# A torchtitan >= 0.3 launch in the form of torchtitan's run_train.sh: a registered config
# (--module/--config) with CLI overrides. `ndplan check` reads it without torchtitan installed.
NGPU=${NGPU:-"16"}
MODULE=${MODULE:-"llama3"}
CONFIG=${CONFIG:-"llama3_8b"}
torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" \
-m torchtitan.train --module ${MODULE} --config ${CONFIG} \
    --parallelism.tensor_parallel_degree 2 \
    --training.local_batch_size 2 \
    --training.global_batch_size 64 \
    activation_checkpoint:selective
