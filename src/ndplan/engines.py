"""Engine profiles: the framework-specific choices behind a memory estimate, as named,
documented settings (never literals inside formulas); the fields are defined and
documented in engine_fields.py. ``derive`` / ``profile`` apply ``--set`` overrides.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from dataclasses import replace

from ndplan.engine_fields import EngineProfile  # noqa: F401 (re-exported)
from ndplan.errors import NdplanError
from ndplan.torch_facts import COMPILED_LOSS_BYTES, GLOO_REDUCE_SCATTER_COPY_BYTES, TORCH_ALLOCATOR_PAIRS  # noqa: F401
from ndplan.units import GIB


MEGATRON = EngineProfile(
    name="megatron",
    weight_bytes=2, master_bytes=4, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=6, gather_prefetch_layers=2, reserve_bytes=1 * GIB, allocator_slack_permille=58,
    loss_saved_bytes_per_element=4,  # core/tensor_parallel/cross_entropy.py: save_for_backward(exp_logits, ...), fp32
    moe_rows_saved=1, megatron_alltoall_rows=True,  # the alltoall dispatcher (engine_fields.py)
    # DDP buckets max(40M, 1M x dp_cp) and the later stages' gather at their first forward (engine_fields.py)
    grad_bucket_min_elements=40_000_000, grad_bucket_elements_per_rank=1_000_000, stage_gather_at_first_forward=True,
    sources={
        "states": "Megatron-LM theoretical_memory_usage.py: 18 bytes/param without the distributed "
                  "optimizer (bf16 param 2 + fp32 main grad 4 + fp32 master 4 + Adam 8); with it, "
                  "6 + 12/dp (master and moments sharded over dp*cp) = ZeRO-1 here",
        "logits": "bf16 logits (2) kept until the fused vocab-parallel cross entropy has built its fp32 "
                  "softmax (4), which it saves for backward: 6 bytes per element "
                  "(Megatron core/tensor_parallel/cross_entropy.py)",
        "reserve": "CUDA context (300-400 MB) and cuBLAS/NCCL workspaces, outside torch's allocator: 1 GiB, "
                   "a named default, not fitted to any case",
        "allocator": "58 per mille: the median reserved/allocated of " + TORCH_ALLOCATOR_PAIRS + "; a margin "
                     "for the upper quartile is --set allocator_slack_permille=220",
    })

FSDP = EngineProfile(
    name="fsdp",
    weight_bytes=4, master_bytes=0, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=12, gather_prefetch_layers=2, reserve_bytes=1 * GIB, allocator_slack_permille=58,
    recompute_layers_spread=True,  # torchtitan's per-layer SAC wraps every N-th block
    reduce_scatter_input_bytes=4, head_group_kept_unsharded=True, layers_resharded_after_forward=True,
    pp_unsharded_stage_bytes=6, fp8_linears_only=True,
    grads_built_in_backward=True, pp_recv_buffers_per_microbatch=True,
    loss_saved_bytes_per_element=4,  # the fp32 log-softmax (tests/test_trace.py test_loss_transient: 4 B kept)
    # eager cross_entropy on the fp32-upcast logits: upcast (2 + 4), log_softmax's three reads and one write (16,
    # cunn_SoftMaxForward: max, exp-sum, write; its shared-memory variant needs under 48 KiB a row); backward:
    # nll_loss_backward zero-fills its fp32 gradient (4), log_softmax's backward reads it for the sum, then it
    # and the output and writes (16), the cast back (4 + 2); torchtitan's loss parallel at tp > 1
    # (_LossParallelCrossEntropy) is not modelled apart
    loss_bytes_forward=22, loss_bytes_backward=26,
    norm_input_bytes=2, norm_stat_bytes=4, swiglu_bytes_per_f=8, repeat_kv_always=True, selective_op_sac=True,
    rope_table_bytes=2, gathered_inputs_kept=True,
    sources={
        "states": "torchtitan FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): sharded "
                  "parameters are fp32 (4) and are the optimizer's master; fp32 grads (4); Adam (8)",
        "logits": "torchtitan's loss, cross_entropy(pred.float(), labels), with pred deleted before "
                  "loss.backward(): the peak is in the loss backward, where the saved fp32 log-softmax (4), "
                  "the gradient nll_loss hands it (4) and the gradient of the fp32 logits (4) are alive "
                  "together: 12 bytes per element (the forward peaks at 10: bf16 logits 2, fp32 copy 4, "
                  "log-softmax 4). Measured on the CPU by tests/test_trace.py (test_loss_transient)",
        "activations": "torchtitan's Llama modules at 55e42c0d (2025-08; the torchtitan versions of the "
                       "published runs in shared/validation/pytorch_memory): nn.RMSNorm, which on CUDA runs "
                       "aten._fused_rms_norm and saves its bf16 input and the fp32 rstd per token "
                       "(torch/_decomp/decompositions.py _fused_rms_norm_backward(grad_out, input, "
                       "normalized_shape, rstd, weight)); FeedForward w2(F.silu(w1(x)) * w3(x)) unfused "
                       "(model.py:237: w1 and w3 outputs, SiLU output, product: 8 B per f); repeat_kv of k "
                       "and v before sdpa (model.py:185-186), so the flash kernel saves a heads of k and v; "
                       "rotary embedding as a complex multiply by the freqs_cis buffer (saves no activation; "
                       "the complex64 buffer, s x d/2 x 8 B, is a graph constant); selective = op-level SAC "
                       "(activation_checkpoint.py _save_list, every other mm saved). torchtitan HEAD "
                       "(b5bcd76c) passes enable_gqa instead of repeat_kv (--set repeat_kv_always=0) and its "
                       "default save ops list aten.linear but not aten.mm, which this profile does not model. "
                       "torchtitan 0.3.0 (PyPI) fuses wqkv (--set fused_qkv=1), passes enable_gqa "
                       "(repeat_kv_always=0) and gives every layer its own RoPE table (rope_table_per_layer=1): "
                       "its llama3 configs run the loss in 8 chunks (ChunkedLossWrapper: --set loss_chunks=8); "
                       "its own model, AC, loss and FSDP2 code on the gloo harness match these settings within 3 % "
                       "(ndplan.trace.titan, tests/test_runtime.py: none, FullAC and SelectiveAC at tokens up to (8, 256)). "
                       "TP + SP is torch DTensor SP (torchtitan apply_tp: PrepareModuleInput all-gathers the "
                       "attention, feed-forward and output-layer inputs to Replicate, and the column-parallel "
                       "linears save the gathered tensor): gathered_inputs_kept, measured by a second trace at "
                       "tp = 2 under torch's fake process group (ndplan.trace.tp, tests/test_traced.py)",
        "gather": "FSDP2 (torch 2.13 torch/distributed/fsdp/_fully_shard): forward keeps about two groups' 16-bit "
                  "all-gather output alive (the flat buffer is freed at the next group's wait_for_unshard, "
                  "_fsdp_param_group.py:429-432, 477-487); backward prefetches one group "
                  "(_fsdp_state.py:384, _fsdp_param_group.py:828-830) and one fp32 reduce-scatter input: the "
                  "previous group's is dropped before the next is allocated (reduce_scatter_max_input_buffers = 1, "
                  "_fsdp_param_group.py:640-657), and the 16-bit unsharded gradients it is copied from "
                  "(_fsdp_collectives.py foreach_reduce) are freed before the sharded fp32 output is allocated, "
                  "as are the layer's own 16-bit weights (_fsdp_param_group.py:637-638): per parameter of the "
                  "group reduced, one fp32 input (4) and max(its 16-bit gradients 2, its sharded output "
                  "4/(dp*cp)), beside the next group's 16-bit weights (2 per its parameter) and the sharded "
                  "gradients written so far; the peak is at the output layer's, the last two or the first two "
                  "layers' reduce-scatters (formulas/fsdp_phases.py fsdp_backward_reduce). On gloo (world 2 and 4) "
                  "the peak also holds gloo's own full copy of the input (GLOO_REDUCE_SCATTER_COPY_BYTES, 4), "
                  "which NCCL does not make. torchtitan's [norm, output] group is resharded after forward only under the "
                  "'always' policy (55e42c0d models/llama3/infra/parallelize.py:408-412). Under pipelining, "
                  "PipelineStage.backward_maybe_with_nosync sets reshard_after_backward and "
                  "requires_gradient_sync False for every micro-batch (stage.py:843-848) and "
                  "perform_reduce_grad reduces once (stage.py:1164-1191); the no-sync gradients accumulate "
                  "unsharded in reduce_dtype fp32 (_fsdp_param.py:802-821): 2 + 4 B per stage parameter, and the "
                  "final reduce adds about two layers' sharded fp32 outputs (read off the gloo runtime at "
                  "dp = 2 and 4, the one coefficient fitted there). torchtitan zeroes the gradients "
                  "(set_to_none) when each step begins (55e42c0d train.py:472). Measured on gloo by "
                  "tests/test_runtime.py",
        "reserve": "1 GiB named default for the CUDA context and NCCL/cuBLAS workspaces",
        "allocator": "58 per mille, the torch caching allocator's median (no FSDP pair was found, so the "
                     "megatron profile's figure): " + TORCH_ALLOCATOR_PAIRS,
    })

DEEPSPEED = EngineProfile(
    name="deepspeed",
    weight_bytes=2, master_bytes=4, optimizer_bytes=8, grad_bytes_fp32=4,
    weights_sharded_from=3, grads_sharded_from=2, master_sharded_from=1,
    logits_bytes_per_element=10, gather_prefetch_layers=2, reserve_bytes=1 * GIB, allocator_slack_permille=373,
    reduce_bucket_elements=500_000_000,  # reduce_bucket_size default (zero/config.py:113)
    # ZeRO-3 PartitionedParameterCoordinator budgets at DeepSpeed 0.19.8's defaults (zero/config.py:222,
    # 245, 251): stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters 1e9, stage3_max_reuse_distance 1e9
    zero3_param_coordinator=True, zero3_prefetch_elements=50_000_000, zero3_live_elements=1_000_000_000,
    zero3_reuse_elements=1_000_000_000,
    # ZeRO-1/2 overlap_comm is off below stage 3 (zero/config.py:384-386): reductions on the compute stream, the
    # post-step all-gather synchronous (stage_1_and_2.py:3155-3160); buckets all-reduced; ZeRO-2 reduces every
    # micro-batch; PipelineEngine reduces after the last backward (engine_fields.py)
    overlap_grad_reduce=False, overlap_param_gather=False, grads_all_reduced=True, zero2_reduce_per_microbatch=True,
    grad_reduce_after_last_backward=True, grad_comm_bytes=2,
    attention_fa2=True,  # Megatron-DeepSpeed's flash-attn 2 (engine_time.py)
    sources={
        "states": "ZeRO paper (Rajbhandari et al. 2020) Sec. 3: K=12 bytes of optimizer state "
                  "(fp32 master 4 + Adam 8) per parameter, bf16 params 2, gradients",
        "logits": "HF-style loss: bf16 logits, fp32 upcast, fp32 log-softmax: 10 bytes per element",
        "reserve": "1 GiB named default",
        "allocator": "373 per mille: the median of the DeepSpeed sources among " + TORCH_ALLOCATOR_PAIRS
                     + " (Megatron-DeepSpeed ZeRO-1 1.229/1.517, ZeRO-2 1.477/1.604, see_memory_usage "
                       "1.010/1.081/1.318: per-source medians 1.373, 1.541, 1.081); few pairs",
    })

MINDSPORE = EngineProfile(
    name="mindspore",
    weight_bytes=2, master_bytes=0, optimizer_bytes=8, grad_bytes_fp32=2,
    weights_sharded_from=1, grads_sharded_from=4, master_sharded_from=1,
    logits_bytes_per_element=12, gather_prefetch_layers=1, reserve_bytes=0,
    norm_input_bytes=2, rope_inputs_kept=True, gathered_inputs_kept=True, swiglu_bytes_per_f=8,
    selective_drops=("qkv_input", "fc1_input", "act_out", "down_input"), comm_recompute_keeps_shard=True,
    score_bytes=6, selective_score_bytes=2, selective_score_global=True, cp_implies_sp=True,
    comm_buffer_sp_gather=False, grads_in_weight_dtype=True, grads_shard_tp_only=True,
    grads_without_accumulation=False, embedding_zero_sharded=False, gather_whole_stage=True, weight_cast_per_microbatch=True,
    optimizer_step_temp_bytes=8, recompute_count_per_stage=True, selective_needs_tp=True,
    sharded_weights_cast_once=True, attention_mask_bytes=2, rope_table_bytes=4, backward_layer_workspace=True,
    moe_dispatch_rows=2,  # the mcore alltoall dispatcher's send and receive buffers (engine_fields.py)
    # MindFormers' loss passes are not read: three fp32 passes (12 B) each way, the former default of every engine
    loss_bytes_forward=12, loss_bytes_backward=12,
    sources={
        "tuning_cases": "Fitted on ../shared/validation/mindformers (25 cases): llama2/70b, balanced, tour1, "
                        "tour2; llama3/cp2_colai, cp2_colai_fullrec, cp2_colai_norec, cp8_colai_no_tp_norec, default, "
                        "norec, n_kv_heads_64, no_op, fullrec, dp, pp8_rank8, no_sp, no_sp_norec, no_sp_fullrec, "
                        "no_fa, no_sp_no_fa, no_sp_norec_no_fa, vp2, vp2_norec, vp5, vp10. Held out (no constant "
                        "read off them, 12): llama3/cp2_ulysses, norec_cp64_colai, norec_cp64_ulysses, norec_dp64, "
                        "norec_pp2, norec_pp4, norec_tp64, num_layers_8, num_layers_8_pp1, per_batch_48, tp8_rank8, "
                        "vp10_less. Not blind: the 37-case MAPE was watched at each tuning step, and graph_constants "
                        "(every stage) and grads_without_accumulation (the pp=1 cases) were read off all cases. "
                        "tests/test_check.py TUNING / HELD_OUT hold the same split",
        "states": "MindFormers FP32StateAdamWeightDecay: fp16/bf16 parameters updated in place (no separate "
                  "master), fp32 moments (8); accumulated gradients `accu_grad` in the parameter dtype (2), "
                  "not sharded unless gradient_accumulation_shard (False in the validation cases). With "
                  "enable_parallel_optimizer (our zero>=1) weights and moments are sharded over dp and "
                  "all-gathered before use. Checked on shared/validation/mindformers llama2/70b stage 0: "
                  "params 2165 MiB, optimizer 8661 MiB (= 4x), accu_grad 4205 MiB (~ 2x, unsharded)",
        "logits": "fp32 logits (4) and the fp32 softmax kept for the gradient (4), plus the fp32 gradient of the "
                  "logits (4) that the loss backward creates while both are alive: 12 bytes per element. Measured: "
                  "with 8 bytes every tp=8 llama3 last stage stayed 1.1-1.4 GB under (norec 1275 MiB, one more "
                  "4-byte copy = 1002 MiB); llama2/70b (tp=4) 449 MiB under (4-byte copy 125 MiB)",
        "activations": "MindFormers LLaMA graph: each RMSNorm saves its 16-bit input (2 bytes; float32 "
                       "layernorm_compute_type acts inside the norm): the unattributed 'other' row of the "
                       "no-SP cases is 263 MiB per layer per micro-batch at tp=8 (no_sp_norec) and tp=1 (dp, "
                       "pp8_rank8) alike, 2 norms x 2 B x s*h = 256 MiB (fp32 would be 512); the rotary "
                       "embedding keeps q and k before rotation: the no-SP attention row exceeds q, k, v, the "
                       "o_proj input and the gathered QKV input by (a+kv)*d*2 B per token /tp (no_sp_norec "
                       "184 vs 164 MiB, dp 576 vs 418 MiB). Per layer per micro-batch this gives SP tp8 566 MiB "
                       "(measured 575), no SP tp8 790 (799), tp1 2738 (2759); with SP the all-gathered norm outputs feeding QKV and FC1 are saved full-size "
                       "(the AllGather rows of the measured insight files: 4*h bytes per token per layer, not "
                       "/tp); SwiGLU unfused (gate, up, SiLU output, product: 8 bytes per f); selective "
                       "recompute (default LLaMA ops + select_comm_recompute) recomputes the gathers, SiLU and "
                       "product; without flash attention the fp32 softmax + fp16 scores (6 bytes per s^2 "
                       "element), 2 under selective; full recompute stores the layer input, TP-sliced only under SP: "
                       "llama3/fullrec (SP) stages 1-6 sit flat on the optimizer-step floor (8465 MiB), which "
                       "an unsliced input (7 x 10 x 128 MiB on stage 1) would exceed; no_sp_fullrec stores "
                       "135 MiB per layer per micro-batch (s*h*2 B, SP off) and cp2_colai_fullrec 70.8 MiB "
                       "((s/cp)*h*2 B, not /tp although CP makes the in-layer tensors SP-like)",
        "static": "accu_grad in the parameter dtype, split over TP only; the input embedding is not sharded by "
                  "the optimizer-parallel group when vocab_emb_dp=False (measured: llama2/70b stage 0 embedding "
                  "125 MiB = V*h*2/tp; split over tp*cp only), and its accu_grad is split over cp like the parameter "
                  "(cp2_colai stage 0: 4331 = 4080 + V*h*4/(8*2); cp8_colai_no_tp_norec: 33141 = 32640 + "
                  "V*h*4/8) while layer and head gradients are not; optimizer-parallel gathers keep 16-bit copies of the stage's weights",
        "optimizer_step": "AdamWeightDecay fp32 update temporaries, one set per local parameter (8 bytes), "
                          "alive only in the optimizer step: the measured flat dynamic floor of fully recomputed "
                          "stages (llama3/fullrec 8465 MiB ~ optimizer states 8161 MiB + 0.3 GiB); what the "
                          "composite AdamW of the validation recipes builds: each new moment out of place, an fp32 "
                          "tensor per state before its assign (mindformers@fd4deebc core/optim/adamw.py:44-52); "
                          "the fused AdamW updates in place (0, interop.mindformers_memory)",
        "recompute_counts": "MindFormers LayerSetting._alloc_recompute_layer (mindformers/models/utils.py): an int "
                            "per stage in recompute/select_recompute is min(n, layers of the stage), allocated "
                            "round-robin over the pp_interleave_num chunks; each chunk recomputes its first layers. "
                            "Measured llama3/vp10 (select_recompute [10,8,6,4,2,0,0,0], 1 layer per chunk): the "
                            "stage-to-stage dynamic step on stages 1-4 grows by the non-selected layers, which a "
                            "per-chunk count (all 10 chunks selective) cannot show",
        "selective_needs_tp": "measured: no_sp is identical to no_sp_norec to the MiB (tp=8, SP off), and llama3/dp "
                              "and pp8_rank8 (tp=1, use_seq_parallel True) have the same dynamic step, 27593 MiB, "
                              "on stages 0-5 although select_recompute is [10,8,6,4,2,0,0,0]; MemEst's MindFormers "
                              "parser likewise zeroes the normOp/ffAct/gather terms only with SP. With tp=1 the SP "
                              "layouts (dp*mp, 1) equal the non-SP ones",
        "comm_recompute": "select_comm_recompute (default pattern .*\\.norm) re-runs the norm-output all-gathers in "
                          "backward, so the sharded norm outputs stay: llama3/default vs norec stage 0 (80 "
                          "selective vs 80 plain layer-micro-batches) differ by AllGather -254, FFN -92 and "
                          "attention +15.7 MiB per layer per micro-batch, i.e. the gathered inputs, SiLU output and "
                          "product go while the attention_norm and ffn_norm outputs (2*h/tp bytes per token, 16 MiB "
                          "each) stay",
        "backward_workspace": "MemEst (huawei_paris memory_estimation/_bwd_overhead.py) adds one more copy of "
                              "the stage's last layer at one micro-batch for 1F1B schedules. Measured: after the "
                              "per-micro-batch activations, every middle stage keeps a flat excess of about one "
                              "layer's activations: no_sp_norec 0.7-1.2 GB (layer 790 MiB), llama2/70b 0.5-0.7 GB "
                              "(442 MiB), dp / pp8_rank8 (tp=1) 1.3-2.4 GB (2738 MiB)",
        "graph_constants": "Static minus (parameters + optimizer states + accumulated gradients) is 137-140 MiB "
                           "on every llama3 stage (s=8192) for any tp, cp or flash attention, 36-39 MiB for "
                           "llama2 (s=4096, also at micro-batch size 8), and 274 / 686 / 1372 MiB with "
                           "pp_interleave_num 2 / 5 / 10: an fp16 s x s causal mask (128 / 32 MiB) plus fp32 "
                           "rotary cos and sin tables s x d (8 / 4 MiB), held by each pipeline chunk",
        "cast_once": "fp32 parameters with enable_parallel_optimizer and dp*cp = 1 (llama3 default, norec, "
                     "n_kv_heads_64): every stage's dynamic memory exceeds the activation model by a flat "
                     "3.4-3.7 GB, of which the 16-bit copy of the stage's weights (10 x 855.65M x 2 B / 8 = 2040 MiB) "
                     "is the part explained; with OP on there is no per-micro-batch cast (no_op adds 204 MiB per "
                     "layer per micro-batch, default does not), so the cast is made once and kept. With dp*cp > 1 "
                     "the same copy is the all-gather output (llama2/70b AllGather row: 4080 MiB = 10 layers' "
                     "fp16 weights / tp). The copy is freed before the optimizer step: cp2_colai_fullrec's flat "
                     "stages sit at the optimizer floor without it",
        "allocator": "0: the measured MindSpore peaks are its own memory pool's",
        "reserve": "0: the measured MindSpore peaks (Static+Dynamic) contain no safety margin "
                   "(shared/validation/mindformers/README.md)",
    })

HF = replace(
    FSDP, name="hf",  # the fsdp profile's states, logits and reserve; the activations as transformers saves them
    norm_input_bytes=6, norm_stat_bytes=4, swiglu_bytes_per_f=8, score_bytes=6, attention_kv_expanded=True,
    rope_table_bytes=2, mla_value_keeps_kv_up=True, repeat_kv_always=False, selective_op_sac=False,
    grads_accumulate_unsharded=True,  # the Trainer's no_sync micro-batches (engine_fields.py)
    sources={
        "states": "Hugging Face Trainer / Accelerate with FSDP or FSDP2 mixed precision (param_dtype bf16) keeps "
                  "what the fsdp profile keeps: " + FSDP.sources["states"] + ". Autocast over fp32 weights "
                  "(Trainer bf16=True without FSDP) saves other tensors and is not modelled by this profile",
        "activations": "transformers modules traced on CPU (`ndplan trace`, transformers 5.17, torch 2.13; "
                       "tests/test_trace.py): LlamaRMSNorm-style norms upcast to fp32 and save the fp32 input "
                       "(4 B per element), the bf16 normalized tensor before the weight (2) and the fp32 1/rms (4 B "
                       "per token); the MLP is unfused (gate, SiLU output, up, product: 8 B per f); sdpa "
                       "(transformers' default) runs the flash path with enable_gqa: q, k, v unexpanded, the "
                       "output and the fp32 log-sum-exp; eager saves k and v after repeat_kv (a heads), the fp32 "
                       "softmax (4) and its bf16 cast (2) per s x s element; MLA (DeepseekV3Attention): the "
                       "latent norms as every norm, and value_states is a view of kv_b_proj's output, so the "
                       "saved v keeps k_nope alive too",
        "logits": "transformers ForCausalLMLoss runs cross_entropy on logits.float(); the Trainer's compute_loss "
                  "drops the outputs (and the bf16 logits) before loss.backward(), so the peak is the fsdp "
                  "profile's: " + FSDP.sources["logits"] + " (traced: the head keeps 4 B per element after the "
                  "forward)",
        "reserve": FSDP.sources["reserve"],
        "allocator": FSDP.sources["allocator"],
    })

ENGINE_PROFILES = MappingProxyType({p.name: p for p in (MEGATRON, FSDP, DEEPSPEED, MINDSPORE, HF)})
"""The base profiles, read-only: a ``--set`` variant is a derived name (``derive``), resolved by ``profile``."""


MAX_SETTING = 2**40
"""Ceiling of an integer engine setting given with --set (byte counts reach about 1e11)."""


def derive(base: str, overrides: dict) -> str:
    """The name of ``base`` with some settings replaced (``--set overlap_tp_comm=1``):
    ``base[key=value,...]``. The name spells out the profile (``profile`` rebuilds it from
    the name), so nothing is registered and kernels cached under it stay valid."""
    if not overrides:
        return base
    from ndplan import limits
    _base_profile(base)
    kinds = _setting_kinds()
    vals = {}
    for k, v in sorted(overrides.items()):
        kind = kinds.get(k, "")
        if kind not in ("bool", "int"):
            raise NdplanError("--set", k, "not a numeric or boolean engine setting",
                              f"choose one of {', '.join(sorted(engine_fields()))}")
        if kind == "bool" and v not in (0, 1):
            raise NdplanError(k, v, "an on/off engine setting", f"give --set {k}=0 or --set {k}=1")
        vals[k] = bool(v) if kind == "bool" else limits.count(k, v, 0, MAX_SETTING, "a whole number")
    return f"{base}[{','.join(f'{k}={int(v)}' for k, v in vals.items())}]"


def _setting_kinds() -> dict[str, str]:
    from dataclasses import fields
    return {f.name: str(f.type) for f in fields(EngineProfile)}


def _base_profile(name: str) -> EngineProfile:
    if name not in ENGINE_PROFILES:
        raise NdplanError("engine", name, "unknown engine", f"choose one of {', '.join(ENGINE_PROFILES)}")
    return ENGINE_PROFILES[name]


@functools.lru_cache(maxsize=64)
def profile(name: str) -> EngineProfile:
    """The profile of an engine name: a base name (``megatron``) or a derived one
    (``megatron[overlap_tp_comm=1]``, made by ``derive``). NdplanError for anything else."""
    from dataclasses import replace
    if "[" not in name:
        return _base_profile(name)
    base, _, rest = name.partition("[")
    if not rest.endswith("]"):
        raise NdplanError("engine", name, "not an engine name", "give megatron, fsdp, deepspeed or mindspore")
    pairs = dict(kv.split("=", 1) for kv in rest[:-1].split(",") if "=" in kv)
    try:
        vals = {k: int(v) for k, v in pairs.items()}
    except ValueError:
        raise NdplanError("engine", name, "engine settings must be integers", "give key=0/1 or key=N") from None
    try:
        canonical = derive(base, vals)
    except NdplanError as e:  # a setting that is not one: name the engine it came in
        raise NdplanError("engine", name, f"setting {e.value}: {e.problem}", e.fix) from None
    if canonical != name:
        raise NdplanError("engine", name, "not a derived engine name", f"write it as {canonical}")
    kinds = _setting_kinds()
    return replace(ENGINE_PROFILES[base], name=name,
                   **{k: bool(v) if kinds[k] == "bool" else v for k, v in vals.items()})


def engine_fields() -> set[str]:
    return {k for k, kind in _setting_kinds().items() if kind in ("bool", "int")}


def fp8_gemms(weight_dtype: str, eng: EngineProfile) -> bool:
    """The layers' GEMMs run in fp8: fp8 weights (``weight_dtype`` fp8) or the engine's fp8
    linears (EngineProfile.fp8_linear_inputs: Megatron-LM ``--fp8-format`` with 16-bit primary
    weights; EngineProfile.fp8_gemm_compute: torchtitan's float8 converter). The one rule for
    Hardware.kernel_values."""
    return weight_dtype == "fp8" or bool(eng.fp8_linear_inputs) or bool(eng.fp8_gemm_compute)
