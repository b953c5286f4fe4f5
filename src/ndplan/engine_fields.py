"""The EngineProfile dataclass: every framework-specific choice behind an estimate as a
named, documented field (the profiles themselves, and ``--set`` overrides, are in engines.py;
the step-time choices, overlap and collectives, are engine_time.TimeChoices, its base).

Bytes per parameter are per element of the state named; ``*_sharded_from`` gives the
ZeRO level from which that state is sharded over the data-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.engine_time import TimeChoices


@dataclass(frozen=True, kw_only=True)
class EngineProfile(TimeChoices):
    name: str
    weight_bytes: int
    """Persistent weight copy per parameter (bf16 = 2; FSDP2 keeps fp32 shards = 4)."""
    master_bytes: int
    """Separate fp32 master copy per parameter (0 if the weights are the master)."""
    optimizer_bytes: int
    """Optimizer states per parameter: Adam's first and second moments in fp32, 2 x 4 bytes, in
    every profile; a reader sets the recipe's optimizer from ndplan.optimizers (SGD with momentum 4,
    16-bit moments 4, ...)."""
    weights_offloaded: bool = False
    """ZeRO-3 parameter offload (DeepSpeed ``zero_optimization.offload_param``, stage 3 only,
    runtime/zero/config.py:164-168 at 0.19.8): the parameter partitions live in host memory and
    only the gathered layers (``mem.zero3_gather``) are on the device; the weights Term moves to
    the host (estimate's host bytes)."""
    secondary_weight_shard: int = 0
    """ZeRO++ hpZ (DeepSpeed ``zero_hpz_partition_size`` > 1, default 1): besides its dp-wide
    partition every ZeRO-3 parameter keeps a secondary partition over the hpz ranks of its node,
    numel / hpz elements in the parameter dtype, allocated once and kept
    (runtime/zero/partition_parameters.py:1900-1929 _partition_param_sec); 0 or 1: none."""
    zero3_param_coordinator: bool = False
    """The ZeRO-3 gathered parameters follow DeepSpeed's PartitionedParameterCoordinator
    (runtime/zero/partitioned_param_coordinator.py at 0.19.8) with the three budgets below,
    instead of ``gather_prefetch_layers`` layers (memory.gather_term, ``deepspeed_gather``)."""
    zero3_prefetch_elements: int = 0
    """``stage3_prefetch_bucket_size`` (default 5e7, zero/config.py:222): at every module's fetch the
    coordinator all-gathers up to this many elements of the parameters used next (:452-485); 0: no
    prefetch."""
    zero3_live_elements: int = 0
    """``stage3_max_live_parameters`` (default 1e9, zero/config.py:245): a prefetch never takes the
    gathered elements past it (``min(max_live - n_available, bucket)``, :453-454); the current
    module's own fetch is not limited."""
    zero3_reuse_elements: int = 0
    """``stage3_max_reuse_distance`` (default 1e9, zero/config.py:251): after its module runs, a
    parameter stays gathered when the modules until its next use hold fewer elements (:653-662)."""
    zero3_quantized_weights: bool = False
    """ZeRO++ qwZ (``zero_quantized_weights``, zero/config.py:328): parameters are all-gathered as int8
    and dequantized when first waited on (partition_parameters.py:1479-1537, 761-796): a prefetched
    bucket holds 1 B per element until then, and the bucket in use its int8 copy and its dequantized
    16-bit flat tensor beside the parameters built from it."""
    reduce_bucket_elements: int = 0
    """ZeRO gradient-reduction bucket (DeepSpeed ``zero_optimization.reduce_bucket_size``, default
    5e8 elements, runtime/zero/config.py:113 at 0.19.8), in the 16-bit gradient dtype, on the device
    beside the backward's activations: ZeRO-1/2 allocate it at the first gradient hook of each
    backward (stage_1_and_2.py:3256-3278, with contiguous_gradients, default True), ZeRO-3 once at
    init (stage3.py:780-784); 0: none (Megatron and FSDP2 reduce in place on views)."""
    fp32_grad_accumulation: bool = False
    """DeepSpeed ZeRO-1 with bf16 weights and ``data_types.grad_accum_dtype`` fp32 (no offload):
    runtime/engine.py:2305-2310 (0.19.8) builds BF16_Optimizer instead of the ZeRO optimizer. It
    shards the fp32 master and the optimizer states over dp (bf16_optimizer.py:181-183, 225) but
    keeps one fp32 gradient buffer of the whole model (:191), allocates no reduce bucket (the
    engine all-reduces that buffer in place, engine.py:3921-3932) and reads none of the ZeRO
    optimizer's bf16 master/states keys."""
    lp_grad_bytes: int = 0
    """Bytes per parameter of 16-bit ``.grad`` tensors kept beside an fp32 gradient accumulation
    buffer: DeepSpeed BF16_Optimizer adds each bf16 ``param.grad`` into the fp32 buffer after the
    backward and zeroes it, not frees it (bf16_optimizer.py:508-530), unless
    ``bf16.immediate_grad_update`` (default false, precision_config.py:51) frees it in the hook
    (:707-715); 2 or 0. Memory only: the reduction runs on the fp32 buffer."""
    fp8_linear_inputs: bool = False
    """fp8 GEMMs in Transformer Engine linears (Megatron-LM ``--fp8-format``): each TE linear
    quantizes its input and saves the fp8 copy for the weight gradient, 1 byte per element, instead
    of the 16-bit input (NVIDIA/TransformerEngine@d0067d0d pytorch/module/linear.py:418-437, 598-621:
    column-wise data only, or the row-wise local shard under sequence parallelism; layernorm_linear
    likewise saves its fp8 ``ln_out``). Applies to the q/k/v, fc1, fc2 and expert/shared fc2 inputs;
    the o_proj input gains an fp8 copy beside the attention output the flash kernel keeps. The MoE
    router, the token permutation and the MLA up-projections keep 16-bit inputs here."""
    fp8_weight_cache_bytes: int = 0
    """Bytes per transformer-layer weight element of Transformer Engine's fp8 weight copies, kept for
    the run: Megatron passes ``is_first_microbatch`` (megatron/core/extensions/transformer_engine.py:
    1338-1345, unless ``--disable-parameter-transpose-cache``), so every TE linear caches its quantized
    weight in ``_fp8_workspaces`` (TE linear.py:1958-1961, 2068-2071; base.py:792-890): row-wise data
    (1) and, where fp8 GEMMs are TN-only (Hopper), its transpose (1) for the backward (storage/
    float8_tensor_storage.py:281-317). With fp8 primary weights (``--fp8-param-gather``) only the
    transpose is extra. 2 (fp8 compute, Hopper), 1 (fp8 primary weights on Hopper, or fp8 compute on
    Blackwell), 0: none. Not applied under ZeRO-3 (weights gathered per layer). The MXFP8 and
    blockwise recipes keep a row-wise and a column-wise copy on every GPU (the latter transposed
    under blockwise; TE@d0067d0d linear.py:463-491, quantizer.cpp:1089-1110, 1521-1531): 2, or 1
    with fp8 primary weights; each copy also carries its block scales (fp8_scale_bytes)."""
    fp8_scale_bytes: int = 0
    """Bytes of one block scale under Transformer Engine's block-scaled fp8 recipes (Megatron-LM
    ``--fp8-recipe``; NVIDIA/TransformerEngine@d0067d0d): MXFP8 1 (E8M0 stored as uint8,
    transformer_engine/pytorch/csrc/quantizer.cpp:1601, 1606), blockwise 4 (fp32, quantizer.cpp:
    1076); 0: one fp32 scale per tensor (delayed and tensorwise scaling, 4 B a tensor, not
    counted). Every fp8 copy of a tensor (row-wise, column-wise) carries its own scales, so the
    bytes per fp8 element are 1 + fp8_scale_bytes / block (groups.fp8_element_bytes)."""
    fp8_act_block: int = 0
    """Elements per scale of the fp8 copy a Transformer Engine linear saves of its input (the
    column-wise copy only, linear.py:601-621; layernorm_linear.py:478-487 for its norm output):
    MXFP8 32 (1 x 32 blocks, pytorch/constants.py:175), blockwise 128 (the recipe's 1-D input
    blocks of 128, common/recipe/__init__.py:435-437, float8_blockwise_tensor.py:55). The scale
    tensors' padding (MXFP8: to 128 x 4 tiles, quantizer.cpp:1852-1880; blockwise: the inner
    dimension to a multiple of 4, :1441-1492) is not counted; 0: per-tensor scales."""
    fp8_weight_block: int = 0
    """Elements per scale of each fp8 weight copy, the fp8 primary weights and the cached workspaces
    alike (base.py:835-845, 1838-1865; linear.py:463-491): MXFP8 32, blockwise 16384 (the recipe's
    2-D 128 x 128 weight blocks, common/recipe/__init__.py:435-437); 0: per-tensor scales."""
    deepep_sms: int = 0
    """DeepEP's normal-mode buffer (Megatron-LM ``--moe-token-dispatcher-type flex`` with the deepep
    backend): the SMs its channels take (``--moe-flex-dispatcher-num-sms``, Megatron's default 20,
    token_dispatcher.py:1287-1292), which with the group size and hidden size fixes the buffer
    (formulas/deepep.py); 0: no DeepEP buffer (the all-to-all dispatcher's are per call)."""
    reduce_bucket_double: bool = False
    """ZeRO-1/2 with ``overlap_comm`` (default only at stage 3, zero/config.py:384-387): a second
    bucket buffer (stage_1_and_2.py:3272-3278)."""
    optimizer_shard_size: int = 0
    """Ranks the optimizer-parallel (ZeRO) states and sharded weights split over, at most: MindSpore
    ``parallel_optimizer_config.optimizer_weight_shard_size`` (default -1: the parameter's whole
    data-parallel group; a size that does not divide that group is not applied, MindFormers
    trainer/training_args.py:173-181 at fd4deebc); 0: the whole group (dp*cp, or edp for experts)."""
    non_matrix_optimizer_bytes: int = 0
    """Optimizer states per parameter of the input embedding and the output layer when the
    optimizer treats them apart (Muon: AdamW's two fp32 moments, 8); 0: ``optimizer_bytes``."""
    grad_bytes_fp32: int
    """Gradient bytes per parameter when grad_dtype=fp32."""
    weights_sharded_from: int
    """Lowest ZeRO level that shards the persistent weights (3 for ZeRO-3/FSDP)."""
    grads_sharded_from: int
    master_sharded_from: int
    logits_bytes_per_element: int
    """Transient bytes per (token, vocab/tp) element at the loss on the last stage."""
    gather_prefetch_layers: int
    """ZeRO-3/FSDP: layers whose unsharded bf16 weights are alive at once (current + prefetch)."""
    recompute_layers_spread: bool = False
    """A partial recompute count (``recompute_layers`` = r of a chunk's n layers) wraps every
    floor(n / r)-th block, as torchtitan's per-layer SAC does (export/torchtitan.py
    layer_sac_count), instead of the first r (Megatron ``--recompute-method block``). The
    activation total is the same; the order differs in FSDP's backward phases
    (fsdp_phases._rebuild_phases): the last wrapped block is rebuilt while the plain layers
    before it still hold their activations."""
    float8_all_gather: bool = False
    """torchao float8 linears with FSDP float8 all-gather (torchtitan ``[float8]
    enable_fsdp_float8_all_gather``, the tensorwise recipe, applied only when dp_shard > 1,
    float8.py before 6348d93d of 2026-04-27, which dropped it): each swapped decoder-layer weight
    (params.float8_linear_pieces) is cast to float8_e4m3fn on its shard and all-gathered as one byte
    per element (torchao float8/fsdp_utils.py ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``),
    so a gathered layer holds 1 B per such element and 2 B for its norms and biases; the embedding
    and output layer stay 16-bit. The saved activations do not change under any float8 recipe:
    ``Float8Linear`` saves its high-precision input and the weight (float8_linear.py:45,
    ``ctx.save_for_backward(input_hp, weight_hp_t)``), so float8 without this all-gather leaves
    memory as in bf16. Checked on the gloo runtime with torchao (benchmarks/memory_validation.py (d),
    tests/test_runtime.py)."""
    reduce_scatter_input_bytes: int = 0
    """ZeRO-3/FSDP in backward, bytes per parameter of the group being reduced in its reduce-scatter
    input (0: no backward reduce-scatter phase is modelled). FSDP2 with reduce_dtype fp32: 4, the
    fp32 input, first beside the 16-bit unsharded gradients it is copied from, then beside the
    sharded fp32 output; the next group's backward-prefetched 16-bit weights sit beside it.
    torch 2.13 drops the previous group's input before the next is allocated
    (``reduce_scatter_max_input_buffers`` = 1, _fsdp_param_group.py:640-657). The phase is
    exclusive with the loss and the forward's gather (formulas/fsdp_phases.py fsdp_backward_reduce:
    the largest over the output layer's, the last two and the first two layers' reduce-scatters,
    with the sharded gradients written by then and the activations not yet freed). Checked on the
    gloo runtime at every shape of benchmarks/memory_validation.py (d); before 2026-12-03 one
    constant (6 + two sharded outputs at the first layer's reduce-scatter) was +2.8 to +4.9 % at
    tokens (1, 64) and (2, 128)."""
    reduce_scatter_copy_bytes: int = 0
    """Bytes per parameter of the group being reduced that the collective backend copies inside a
    reduce-scatter (NCCL: 0, in place; gloo: GLOO_REDUCE_SCATTER_COPY_BYTES, which the CPU runtime
    harness sets, trace/runtime.py gloo_engine)."""
    grads_built_in_backward: bool = False
    """With the weights sharded (zero >= weights_sharded_from), gradients are freed when each step
    begins (``optimizer.zero_grad()`` with set_to_none) and each FSDP group's sharded gradient is
    written at its reduce-scatter, so they build up while
    backward frees the activations: the peak holds max(gradients, activations + transients +
    gather buffers) above weights and optimizer states (memory.stage_memory)."""
    head_group_kept_unsharded: bool = False
    """The output layer's FSDP group is not resharded after forward, so its 16-bit weights stay
    gathered through the loss and into backward (torchtitan: [norm, output] with
    reshard_after_forward only under the "always" policy)."""
    layers_resharded_after_forward: bool = False
    """Without pipelining, every decoder layer's group is resharded as its forward ends, so at the
    loss no layer's 16-bit weights are gathered (only the output layer's, head_group_kept_unsharded);
    the backward prefetches the last layer once the output layer's backward begins. torchtitan's
    "default" policy without PP (reshard_after_forward True for every block, 55e42c0d
    torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy). Measured on the gloo
    runtime (trace/runtime.py, fsdp at world 4, tokens (2, 128)): at the loss the live bytes are the
    activations, the output layer's group and the loss transient, 5,144 B (0.05 %) from the Terms
    without any layer gathered (memory.transient_term)."""
    pp_unsharded_stage_bytes: int = 0
    """With pipeline parallelism, bytes per stage parameter that FSDP keeps unsharded from the
    first micro-batch's backward to the step's end (0: the per-layer gather): torch.distributed
    .pipelining runs every micro-batch's backward without gradient sync or resharding and
    reduces once at the end, so the 16-bit unsharded parameters (2) and the fp32 unsharded
    accumulated gradients (4) of the whole stage stay."""
    pp_recv_buffers_per_microbatch: bool = False
    """Pipelining with torch.distributed.pipelining (torch <= 2.13): every PipelineStage allocates,
    when its schedule first runs, one activation receive buffer per micro-batch on each chunk
    that is not the first virtual stage and one gradient receive buffer per micro-batch on each
    chunk that is not the last (stage.py:2254-2275 ``_setup_forward_recv_info``, 2286-2320
    ``_create_grad_recv_info``) and keeps them for the whole run; the multi-stage runtime keeps
    every tensor it sent until the step ends (formulas/memory.py ``MULTI_STAGE_RUNTIME``). Known
    upstream: pytorch#136380, PRs #193872 and #196463 (allocate just in time; not in 2.13).
    Measured on gloo by tests/test_runtime.py."""
    loss_saved_bytes_per_element: int = 0
    """Bytes per logit the loss keeps from its forward to its backward: on the last pipeline
    stage every held micro-batch but the one in backward (counted in the logits transient)
    keeps them, since the loss runs in each micro-batch's forward (0: not modelled)."""
    compiled_blocks: bool = False
    """Every decoder layer runs under torch.compile (torchtitan ``compile.enable`` compiles each
    block, apply_compile). What a compiled graph saves is chosen by AOTAutograd's min-cut
    partitioner with inductor's decompositions, which recomputes cheap pointwise ops in backward
    instead of saving their outputs: without recompute (and under Megatron-style selective) a
    layer keeps each norm's 16-bit input and 1/rms only (``norm_input_bytes`` 2: the fp32 copies
    transformers' RMSNorm saves are recomputed) and its gated MLP's gate, up and product
    outputs but not the SiLU output (``swiglu_bytes_per_f`` 6). Measured on the transformers
    Llama layer: exactly 8h + 8 + 4ad + 4kv*d + 4a + 6f bytes per token compiled against
    16h + 8 + 4ad + 4kv*d + 4a + 8f eager (``ndplan trace --policy compiled``,
    tests/test_trace.py). Op-level SAC and full recompute keep their own saved sets (the
    partitioner honours the checkpoint's policy); the output layer is not compiled."""
    compiled_loss: bool = False
    """The loss runs under torch.compile (torchtitan ``compile.enable`` compiles the loss since
    bbb1b616, 2025-04-02): inductor fuses the fp32 upcast, log-softmax and its gradient, so the
    loss keeps only the bf16 logits and writes a bf16 gradient: ``COMPILED_LOSS_BYTES`` per
    element instead of ``logits_bytes_per_element``."""
    loss_chunks: int = 0
    """The loss runs in this many sequence chunks before the decoder's backward (torchtitan 0.3.0's
    ``ChunkedLossWrapper``, ``num_chunks`` 8 in its llama3 configs; components/loss.py): the model
    skips the output layer, and for each chunk the output layer, the loss and their backward run
    at once, with that chunk's logits referenced by the loop (``logits_bytes_per_element`` + 2 per
    element of one chunk), beside an fp32 buffer of the hidden-state gradient (``GradAccumulator``,
    4 B per token and hidden unit), the chunks' contiguous copies (2 B, micro-batch > 1: a split of
    a [b, s, h] tensor on s is not contiguous) and the output layer's gradient accumulated
    unsharded in fp32 across the chunks (no gradient sync until the last, FSDP2
    ``unsharded_accumulated_grad``), which the last chunk reduce-scatters while every activation
    is alive. 0: one loss over the whole logits after the forward."""
    reserve_bytes: int
    """Named framework reserve added to every device's peak: memory outside the framework's
    tensor allocator (CUDA context, NCCL and cuBLAS workspaces)."""
    allocator_slack_permille: int = 0
    """What the caching allocator holds beyond the live tensors at the peak (block rounding,
    cached free blocks, fragmentation), per mille of the allocated bytes: reserved =
    allocated x (1 + slack/1000). 0 for an engine whose measured peaks are its own pool's."""
    sources: dict
    # --- activation choices (formulas/activations.py) ---
    norm_input_bytes: int = 2
    """Bytes per element of the norm input saved for backward (4 when norms compute in fp32)."""
    norm_stat_bytes: int = 0
    """Bytes per token each RMSNorm saves for its statistic (the fp32 1/rms: 4); 0 = not counted."""
    mla_value_keeps_kv_up: bool = False
    """MLA: v is a view of the kv up-projection output, so keeping v keeps the whole output,
    k_nope included (a*(dn+dv) per token instead of a*dv)."""
    attention_kv_expanded: bool = False
    """Without flash attention, k and v are saved after repeat_kv, with a heads each instead of kv."""
    repeat_kv_always: bool = False
    """k and v are expanded to a heads (``repeat_kv``) before the attention kernel, flash or
    not, so the kernel saves the expanded copies (torchtitan until ``enable_gqa``)."""
    fused_qkv: bool = False
    """q, k and v come from one fused linear (one ``aten.mm``, torchtitan 0.3.0's default
    ``fuse_qkv=True``, models/llama3/__init__.py ``_build_llama3_layers``): op-level SAC counts
    one mm where separate projections count three (``activations.mm_outputs``)."""
    rope_inputs_kept: bool = False
    """The rotary embedding saves its q and k inputs for backward (x*cos + rotate(x)*sin through
    multiplies whose backward keeps both operands), beside the rotated q and k."""
    gathered_inputs_kept: bool = False
    """SP: the all-gathered norm outputs (QKV and FC1 inputs) are saved full-size, not re-gathered."""
    swiglu_bytes_per_f: int = 6
    """Gated MLP bytes saved per intermediate element: fused SwiGLU keeps gate+up (4) and the
    down-projection input (2); an unfused graph also keeps the SiLU output (+2)."""
    selective_op_sac: bool = False
    """``selective`` recompute is op-level selective checkpointing (torchtitan's AC mode
    ``selective`` with ``selective_ac_option = "op"``): each layer stores its input, every
    other mm output and the attention kernel's outputs (formulas/activations.op_sac_layer);
    False: the components in ``selective_drops`` are recomputed (Megatron)."""
    selective_drops: tuple[str, ...] = ("core",)
    """Activation components the engine's selective recompute does not store."""
    moe_capacity_permille: int = 0
    """Token-expert rows per routed token-expert pair, in thousandths (0: dropless routing, each
    token's top-k experts, 1000). Megatron with ``--moe-expert-capacity-factor cf``: capacity =
    ceil(tokens x topk / experts x cf) per expert (megatron/core/transformer/moe/moe_utils.py:248-266,
    1049-1055); with ``--moe-pad-expert-input-to-capacity`` every local expert receives its
    capacity (token_dispatcher.py:517-539), cf x 1000, else the tokens over capacity are dropped
    (moe_utils.py:1077-1081), min(cf, 1) x 1000 under balanced routing. MindFormers' MoE pads every
    expert to capacity_factor x its share. Scales the expert activations, FLOPs and all-to-all
    bytes (ActContext.capacity)."""
    moe_rows_saved: int = 2
    """Copies of an MoE layer's routed rows (token-expert pairs x h, 16-bit) that its dispatch
    path saves for backward, the expert fc1's input among them. 2 (the default, the hf and fsdp
    profiles): the permuted input and the expert output, as the transformers MoE modules save them
    (tests/test_trace.py). Megatron-LM's alltoall dispatcher saves 1, fc1's input: its permute
    (index_select) and unpermute (scatter_add_) save only their indices, _AllToAll saves nothing,
    and the router probabilities are applied inside the experts (NVIDIA/Megatron-LM@d98e8a64
    moe_utils.py permute/unpermute, tensor_parallel/mappings.py:428-431, token_dispatcher.py:891-899,
    experts.py:961-1015). MindFormers' mcore alltoall dispatcher saves 2: the grouped matmul's
    input and the unpermuted output that multiplies the probabilities (mindspore-lab/mindformers@
    f52743ca parallel_core/training_graph/transformer/moe/token_dispatcher.py:636-643, 794-804)."""
    moe_allgather_dispatch: int = 0
    """1: Megatron-LM's allgather token dispatcher (its default, ``--moe-token-dispatcher-type
    allgather``; NVIDIA/Megatron-LM@d98e8a64 transformer/moe/token_dispatcher.py:233-372). Each
    MoE layer gathers the hidden states of its expert-TP x EP group (its "tp" is expt_tp,
    :46-52), s x b / t_sp x etp x ep tokens x h, 16-bit, into the process-wide "mpu" buffer (token_dispatcher.py:299-301 ``use_global_buffer=True``,
    tensor_parallel/mappings.py:142-143), which core/utils.py:727-750 GlobalMemoryBuffer keeps at
    the largest size asked for, shared with the SP all-gathers (tensor_parallel/layers.py:627):
    the comm_buffers Term is the larger of the two. Each rank's experts take every routed row of
    its local experts (the gathered tokens x k/E x E/ep, times the capacity; permute saves only
    its indices, moe_utils.py), and the combine holds the experts' output beside its
    unpermuted copy of the gathered tokens before the reduce-scatter (token_dispatcher.py:346-367),
    an exclusive transient (dispatch.moe_allgather_transient). The probabilities take the logits'
    dtype (moe_utils.py:936), so the combine's ``.to(local_probs.dtype)`` copies nothing unless
    ``--moe-router-dtype fp32`` (not modelled). The saved tensors are the alltoall's
    (moe_rows_saved 1). 0: the engine's all-to-all dispatch (moe_dispatch_rows)."""
    moe_dispatch_rows: int = 0
    """Copies of the routed rows of one MoE layer, before any expert-TP gather (k x tokens x h,
    16-bit, times the capacity), alive beside its saved tensors at the peak of its dispatch and
    combine: an exclusive transient (formulas/memory.py transient_term). MindFormers' mcore
    dispatcher: 2, the all-to-all's send buffer (the permuted tokens) and its receive buffer
    coexist (token_dispatcher.py:617-621 at f52743ca; AlltoAllV is not in place), then the
    receive buffer beside its sorted copy, which is saved; the legacy MoEV2 sends and receives E x
    capacity rows alike (modules/transformer/moe.py:454-457, 483-487). 0: none, or derived from the
    degrees (Megatron-LM: megatron_alltoall_rows), or not derived (the transformers modules loop over
    experts one at a time)."""
    megatron_alltoall_rows: bool = False
    """Megatron-LM's alltoall dispatcher (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/moe/
    token_dispatcher.py): the rows one MoE layer holds beside what it saves follow the expert-TP
    degree and the local expert count (formulas/dispatch.py megatron_alltoall_rows). MoELayer
    .custom_forward holds the permuted tokens and the dispatch all-to-all's output until its forward
    ends (moe_layer.py:663, 680) and routed_experts_compute the experts' output (moe_layer.py:
    565-569; etp x rows after the expert-TP all-gather, token_dispatcher.py:741-748); with more than
    one local expert the combine first unsorts it (a copy, token_dispatcher.py:817-822); then the
    reduce-scatter over expert-TP writes its output (rows, :829-833), or at etp 1 the combine
    all-to-all its receive buffer (:864-870). At the peak: 3 + u rows at etp 1, 3 + etp (1 + u)
    above (u = 1 with more than one local expert, else 0). The fp32 copy ``--moe-router-dtype
    fp32`` adds at the reduce-scatter (:830) is not modelled."""
    keep_core_attn: bool = False
    """Selective recompute without the attention core (Megatron ``--recompute-modules`` lists
    that omit core_attn): the core's tensors stay stored."""
    recompute_layernorm: bool = False
    """Megatron ``--recompute-modules layernorm``: the norms that are modules of their own are
    wrapped in CheckpointWithoutOutput, whose output (the next linear's saved input) is freed and
    rebuilt in backward (NVIDIA/Megatron-LM@d98e8a64 megatron/core/transformer/transformer_layer.py:
    712-721, 820-828, freed at 683-688, 1088-1093). With Transformer Engine specs the dense input and
    pre-MLP norms are fused into TELayerNormColumnParallelLinear (the pre-MLP norm is an IdentityOp
    unless num_experts is set, models/gpt/gpt_layer_specs.py:318-336; an IdentityOp is never wrapped,
    transformer_layer.py:476, 523-527), so it acts on a MoE layer's pre-MLP norm and MLA's input norm."""
    recompute_mla_up_proj: bool = False
    """Megatron ``mla_up_proj``: CheckpointWithoutOutput over qkv_up_proj_and_rope_apply frees the
    full-head q, k, v after core attention has saved them; the compressed latents stay
    (transformer/multi_latent_attention.py:171-174, 455-458, 983-988)."""
    recompute_mlp: bool = False
    """Megatron ``mlp``: tensor_parallel.checkpoint over a dense layer's MLP, which keeps only its
    input (transformer_layer.py:537-539, 992-1010); under TE the pre-MLP norm is fused into fc1, so
    the checkpoint's input is the residual stream (the norm's input) and the norm output goes too."""
    recompute_moe: bool = False
    """Megatron ``moe``: the whole MoE layer (router, dispatch, experts, combine) in one
    tensor_parallel.checkpoint that keeps its hidden_states input (transformer/moe/moe_layer.py:
    247-251, 701-717)."""
    recompute_moe_act: bool = False
    """Megatron ``moe_act``: CheckpointWithoutOutput over the experts' activation function frees the
    fc2 input; the fc1 output and the probs stay (transformer/moe/experts.py:269-276, 1013-1030;
    needs --moe-grouped-gemm, transformer_config.py:1964-1967)."""
    recompute_shared_experts: bool = False
    """Megatron ``shared_experts``: tensor_parallel.checkpoint over the shared experts, which keeps
    their input (transformer/moe/moe_layer.py:252-255, 517-531)."""
    comm_recompute_keeps_shard: bool = False
    """When selective recompute drops a kept all-gathered linear input (``gathered_inputs_kept``),
    the all-gather is re-run in backward, so its SP-sharded input (2*s*b*h/tp) stays stored."""
    score_bytes: int = 0
    """Without flash attention: bytes per s x s score element saved (0 = Korthikanti's softmax +
    dropout accounting)."""
    selective_score_bytes: int = 0
    """Score bytes still saved per element under selective recompute (without flash attention)."""
    selective_score_global: bool = False
    """Without flash attention, configuring selective recompute on any layer sets the score
    bytes of every layer to ``selective_score_bytes`` (MindFormers applies the softmax
    recompute flag model-wide: measured llama3/no_fa, whose selective list ends in zeros)."""
    cp_implies_sp: bool = False
    """Context parallelism shards the residual stream over the TP group as SP does
    (measured llama3/cp2_colai_norec: 305.6 MiB per layer per micro-batch with SP off
    matches the SP form, 4h + (12h + 4g + 8f)/tp bytes per token)."""
    full_recompute_input_sliced: bool = True
    """Full recompute stores the layer input TP-sliced when SP is on (the user's SP switch: an
    SP-like layout implied by CP, ``cp_implies_sp``, stays inside the layer)."""
    comm_buffer_sp_gather: bool = True
    """A transient SP all-gather output (2*s*b*h) on top of stored activations."""
    # --- static-memory choices ---
    attention_mask_bytes: int = 0
    """Bytes per element of a persistent s x s causal attention mask (full sequence, also under
    CP), one per pipeline chunk (0: the kernels build the mask on the fly)."""
    rope_table_bytes: int = 0
    """Bytes per element of persistent rotary cos and sin tables (s x head_dim each), one pair
    per pipeline chunk (0: computed on the fly)."""
    rope_table_per_layer: bool = False
    """Every decoder layer holds its own rotary table (torchtitan 0.3.0: each Attention builds its
    RoPE module, whose non-persistent ``cache`` buffer is precomputed for the training sequence,
    models/common/rope.py ``RoPE.__init__`` and decoder.py ``update_from_config``), so the tables
    count once per layer of the stage instead of once per chunk."""
    grads_in_weight_dtype: bool = False
    """Accumulated gradients use the persistent weight dtype (MindSpore accu_grad)."""
    grads_shard_tp_only: bool = False
    """Gradients split over TP only, never over dp/cp (MindSpore without gradient_accumulation_shard);
    an input embedding that is not ZeRO-sharded keeps its (tp*cp) slice in the gradient too."""
    grads_without_accumulation: bool = True
    """A persistent gradient buffer exists even without micro-batch accumulation. MindSpore
    keeps ``accu_grad`` only when it accumulates (pp > 1 or several micro-batches): the
    measured pp=1 cases report 0 MiB accumulated gradients."""
    embedding_zero_sharded: bool = True
    """The input embedding is sharded over dp by ZeRO/optimizer parallel."""
    gather_whole_stage: bool = False
    """ZeRO-3-like gather keeps 16-bit copies of all the stage's weights at once (MindSpore
    optimizer parallel) instead of ``gather_prefetch_layers`` layers."""
    weight_cast_per_microbatch: bool = False
    """Without weight sharding, fp32 weights are cast to 16-bit per micro-batch and the cast is
    saved for backward (per in-flight micro-batch)."""
    backward_layer_workspace: bool = False
    """During a layer's backward the gradients of its activations, about one micro-batch of that
    layer's no-recompute activations, are alive beside the stored ones (exclusive with the loss
    logits, like the layer that full recompute rebuilds)."""
    sharded_weights_cast_once: bool = False
    """Weights stored wider than 16 bits and sharded (optimizer parallel): the 16-bit copy of
    the stage's weights exists even when dp*cp = 1, as the cast output, made once per step and
    shared by all micro-batches like the all-gather output (``gather_whole_stage``)."""
    optimizer_step_temp_bytes: int = 0
    """Temporaries per local parameter during the optimizer step (no activations alive then)."""
    muon_tp_mode: int = 0
    """Megatron-LM ``--optimizer muon``: the step's Newton-Schulz scratch of its largest matrix
    (formulas/muon.py) under ``--muon-tp-mode`` 1 duplicated (the default: each TP rank
    orthogonalises the whole gathered matrix), 2 blockwise (its shard), 3 distributed (its
    shard, with the Gram matrix of the unsplit side); 0: no Muon."""
    muon_ns_fp32: bool = False
    """``--muon-fp32-matmul-prec`` low or high: Newton-Schulz iterates in fp32; medium (the
    default) casts to bf16 (emerging_optimizers muon_utils.py:245-269)."""
    muon_split_qkv: bool = True
    """Muon orthogonalises Q, K and V apart (``--muon-no-split-qkv`` turns it off)."""
    recompute_count_per_stage: bool = False
    """With VPP, a recompute layer count (``Strategy.recompute_layers``) is the total of the
    whole stage, dealt one layer at a time to its chunks 0, 1, ..., vpp-1, 0, ... (each chunk
    recomputes its first layers). False: the count applies to each chunk (Megatron
    ``--recompute-num-layers`` counts layers per model chunk)."""
    selective_needs_tp: bool = False
    """Selective recompute takes effect only when SP splits the sequence over a TP group of
    more than one device; with SP off (or tp = 1, where SP is a no-op) the selected layers
    store what unselected layers store."""
    megatron_fsdp: bool = False
    """Megatron-FSDP v1 (Megatron-LM ``--use-megatron-fsdp``; NVIDIA/Megatron-LM@d98e8a64, files under
    megatron/core/distributed/fsdp/src/megatron_fsdp/): the ZeRO level is its
    ``--data-parallel-sharding-strategy`` (no_shard 0, optim 1, optim_grads 2, optim_grads_params 3,
    param_and_grad_buffer.py:2330-2348), whose persistent buffers are the states Terms: model weights
    in the parameters' dtype (none at 0, sharded at 3, :2651-2667), main weights in
    ``--megatron-fsdp-main-params-dtype`` (fp32, ``master_bytes``; sharded from 1, :2689-2705), main
    gradients in the parameters' dtype unless ``--megatron-fsdp-main-grads-dtype`` (sharded from 2,
    :2313-2322, 2708-2733). On top (formulas/megatron_fsdp.py): at 3 the embedding and output layer,
    not FSDP units (mcore_fsdp_adapter.py:171), stay gathered for the run (megatron_fsdp.py:1086-1099;
    param_and_grad_buffer.py:4364-4367, 4636-4641), and the running decoder layer plus those
    prefetched up to half the communication unit are gathered (:4487-4514); at 2 and 3 every gradient
    goes through an unsharded bucket held in a reduce-scatter queue of up to the communication unit
    (:3094-3118, 3936-3948); at every level the optimizer step casts the main gradients to the main
    weights' dtype (:3351-3381), kept to the next zero_grad (:3189-3214)."""
    megatron_fsdp_comm_unit_elements: int = 0
    """Megatron-FSDP ``--suggested-communication-unit-size`` in elements: the reduce-scatter queue's
    capacity and twice the all-gather prefetch (megatron_fsdp.py:443-444); 0: Megatron's default,
    max(1e9, 2 x a unit's parameters) at optim_grads_params, max(1e9, the DDP bucket) below
    (megatron_fsdp.py:420-441)."""
    megatron_fsdp_double_buffer: bool = False
    """Megatron-FSDP ``--fsdp-double-buffer`` (also set by ``--use-nccl-ub`` and
    ``--megatron-fsdp-max-pool-double-buffer``, arguments.py:1172-1181): the units' all-gather and
    gradient buckets come from pools of two units' buffers, kept for the run (FixedPoolAllocator,
    param_and_grad_buffer.py:647-857, 2519-2576), and prefetch and the reduce-scatter queue stop at
    two units (:4475-4484, 3956-3978)."""
    megatron_fsdp_grad_comm_bytes: int = 0
    """Bytes per element of Megatron-FSDP's unsharded gradient buckets under
    ``--megatron-fsdp-grad-comm-dtype`` (param_and_grad_buffer.py:3107-3111); 0: the main gradients'."""
    megatron_deepspeed: bool = False
    """Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed@f4157bea): DeepSpeed's engine, not Megatron-LM's
    distributed optimizer or torch FSDP2, shards at the ZeRO stage its config sets
    (interop/megatron_deepspeed.py), so rules.py's megatron ZeRO rules (zero 2 only under
    Megatron-FSDP; zero 3 without pp, ep or tied embeddings) do not hold; its own (ZeRO-2/3 only
    with --no-pipeline-parallel) is the reader's. Reads no formula."""
    moe_tp_without_sp: bool = False
    """MindFormers up to 1.5.0 runs a legacy ``moe_config`` MoE with tensor parallelism and no
    sequence parallelism (mindformers@v1.5.0 tools/check_rules.py has no MoE check; the legacy
    MoEV2's non-SP path, modules/transformer/moe.py:680-699), which 1.6.0 refuses (check_rules.py
    _check_moe_parallel_valid, :151-157 at v1.6.0); rules.py's mindspore MoE SP rule does not hold.
    Set by the MindFormers reader for such a recipe, with a note. Reads no formula."""
    grads_offloaded: bool = False
    """Gradient offload: FSDP2's ``CPUOffloadPolicy`` (torchtitan ``training.enable_cpu_offload``,
    parallelize.py ``fsdp_config["offload_policy"]``) copies each sharded gradient to host memory in
    backward (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_collectives.py:711-738 foreach_reduce, the
    device-to-host copy into the CPU ``sharded_param.grad``), beside the sharded parameters
    (``weights_offloaded``) and the optimizer states (``Strategy.offload_optimizer``), and the
    optimizer steps on the host: the gradients Term moves to the host at the sharding levels
    from ``grads_sharded_from``. The host step and the copies are not in the step time."""
    fp8_gemm_compute: bool = False
    """The linears' GEMMs run in fp8 on 16-bit weights and saved 16-bit inputs: torchao's
    ``Float8Linear``, which torchtitan's float8 converter swaps in (``model.converters`` float8 /
    quantize.linear.float8; 0.3.0 llama3_405b's registered converter): each matmul casts its input
    and weight to float8 with dynamic scales and saves the high-precision tensors for backward
    (torchao float8/float8_linear.py matmul_with_hp_or_float8_args). The GEMMs are timed at the FP8
    peak with their operands quantised (engines.fp8_gemms, Hardware.kernel_values); memory is the
    16-bit one. Set by the torchtitan readers."""
    grads_accumulate_unsharded: bool = False
    """Micro-batches before the last run without gradient sync: Hugging Face Trainer wraps each in
    ``accelerator.no_sync`` (transformers 5.17 trainer.py:1832-1840), under which FSDP keeps the
    gradients unsharded and accumulates them (torch 2.13 FSDP2 ``set_requires_gradient_sync(False)``,
    _fsdp_param.py:802-821: in reduce_dtype, fp32), reducing once at the last micro-batch. With
    micro-batches (pp 1, m >= 2) the gradients Term is then the unsharded one beside the activations,
    not the sharded one torchtitan accumulates (fsdp_phases.accumulating)."""
