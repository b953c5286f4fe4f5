"""The PyTorch parallel runtime measured on the CPU: FSDP2 on gloo, live tensor bytes per rank.

Each rank of a gloo process group (``torch.multiprocessing`` spawn, world size 2 to 8)
builds a small transformers Llama in fp32, shards it as torchtitan does (the input
embedding, every decoder layer, and [norm, lm_head] with ``reshard_after_forward=False``
as groups under a root; ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``)
and runs AdamW steps while ``StorageMeter`` counts every tensor storage the process holds.
FSDP2 frees buffers with ``storage.resize_(0)``, so the meter sums the storages' current
sizes after every op instead of counting allocations.

Modes:
- ``fsdp``: one micro-batch per step, each backward reduce-scatters (torchtitan without PP);
- ``fsdp-pp``: what a ``torch.distributed.pipelining`` stage does to its FSDP modules: every
  micro-batch's backward runs with ``set_is_last_backward(False)``,
  ``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)``
  (stage.py:843-848, torch 2.13), then the flags are restored and each group's
  ``post_backward`` and the root's final callback run once (``perform_reduce_grad``,
  stage.py:1164-1191). One stage holding the whole model, no send/recv: it isolates what
  FSDP holds between the micro-batches (``held``);
- ``tp``: torchtitan's TP + SP plan (``trace.tp``, with its vocabulary-parallel embedding and
  loss) as DTensors on the tp dimension of a (dp, tp) mesh, then FSDP2 over dp, one
  micro-batch per step, the loss under ``loss_parallel``. (torchtitan applies FSDP only when
  dp_shard > 1: a dp = 1 case here would run FSDP2 on one rank, which torchtitan does not.)
  The states match the Terms per rank, and the peak within 0.6 % at tokens (1, 64), (2, 128) and (4, 256)
  (benchmark (d)). The meter sees DTensor ops, not the local ops inside them: temporaries inside
  the vocab-parallel loss (torch/distributed/tensor/parallel/loss.py) are not counted;
- ``pp``: the real pipeline, as torchtitan runs it: a (pp, dp) mesh, each rank's chunks (the
  "loop" placement: chunk c of rank r is virtual stage r + c*pp) cut from ``PP_CONFIG`` as
  embedding + decoder layers + [norm, lm_head], each sharded by ``_shard`` with
  ``reshard_after_forward=False`` (torchtitan's "default" policy under PP,
  torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy), wrapped in
  ``PipelineStage`` and run by torch's ``Schedule1F1B``, ``ScheduleGPipe`` or
  ``ScheduleInterleaved1F1B`` with ``return_outputs=False`` (torchtitan trainer.py:827-834),
  send/recv on gloo.

Recorded per rank, in bytes: ``states`` (after the first optimizer step: sharded fp32
parameters, sharded fp32 gradients, Adam moments; under ``pp`` also the receive buffers),
``base`` (after ``zero_grad``: parameters and moments), ``peak`` (largest total during the
second step's forward and backward) and, in ``fsdp-pp``, ``held`` (total after the last
micro-batch's backward, before the reduce); ``stage`` is the rank's pipeline rank.
"""

from __future__ import annotations

import os
import socket
import tempfile
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512,
          "max_position_embeddings": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
          "attention_dropout": 0.0}
"""The measured model: every size divisible by 8, so no FSDP shard is padded at world <= 8;
parameters (about 2.1 M) dwarf the activations of ``TOKENS``."""

TOKENS = (1, 4)
"""(micro-batch, sequence) of every step: a few KiB of activations beside MiB of states."""

PP_CONFIG = CONFIG | {"num_hidden_layers": 4}
"""The pipelined model: four layers, one per chunk at pp = 2 and vpp = 2."""

SCHEDULES = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe", "interleaved": "ScheduleInterleaved1F1B"}
"""ndplan schedule -> torch.distributed.pipelining class."""


@dataclass(frozen=True)
class Case:
    name: str
    mode: str = "fsdp"
    world: int = 2
    microbatches: int = 1
    pp: int = 1
    tp: int = 1
    """``tp`` mode: torchtitan's TP + SP plan (trace.tp) on the tp dimension, FSDP2 over dp."""
    schedule: str = "1f1b"
    tokens: tuple[int, int] = TOKENS
    """(micro-batch, sequence); ``pp`` cases use activations comparable to the states."""
    float8: bool = False
    """torchao float8 linears (tensorwise; the output layer stays bf16), as torchtitan's float8
    converter does; needs torchao (the tests and the benchmark skip such a case without it)."""
    ac_every: int = 0
    """torchtitan's activation checkpointing of whole blocks (0: none): 1 wraps every decoder layer
    (``mode = "full"``), N > 1 every N-th (per-layer SAC, ``selective_ac_option = "N"``,
    export.torchtitan.layer_sac_count), in ``fsdp`` mode; predicted as full recompute of that
    many layers (``recompute_layers``)."""
    float8_all_gather: bool = True
    """With ``float8``: FSDP float8 all-gather (torchtitan ``enable_fsdp_float8_all_gather``),
    predicted with the engine setting ``float8_all_gather``; without it, as bf16."""
    source: str = "transformers"
    """``torchtitan``: torchtitan's own Llama 3 modules, AC and FSDP2 code (``trace.titan``, ``fsdp``
    mode; needs torchtitan and triton), predicted with the fsdp profile (``trace.titan.TITAN_SETTINGS``);
    ``ac_every = 1`` is its FullAC."""
    op_sac: bool = False
    """With ``source = "torchtitan"``: its op-level SelectiveAC on every block, predicted as the fsdp
    profile's selective recompute (``selective_op_sac``)."""
    loss_chunks: int = 0
    """With ``source = "torchtitan"``: its ChunkedLossWrapper with this many chunks (its llama3
    configs' loss, 8), predicted with the engine setting ``loss_chunks``; 0: cross_entropy on the
    whole logits."""
    vocab: int = 0
    """The vocabulary size in place of ``CONFIG``'s (0: CONFIG's), e.g. Llama 3's vocabulary/hidden
    ratio (about 31) where the loss phase is the peak."""

    @property
    def config(self) -> dict:
        return CONFIG | ({"vocab_size": self.vocab} if self.vocab else {})

    @property
    def vpp(self) -> int:
        return 2 if self.schedule == "interleaved" else 1


@dataclass(frozen=True)
class Measured:
    case: str
    rank: int
    states: int
    base: int
    peak: int
    held: int = 0
    stage: int = 0


class StorageMeter:
    """Sum of the current sizes of every storage the ops made, sampled after each op."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
        meter = self
        self._live: dict[int, weakref.ref] = {}
        self.total = 0
        self.peak = 0

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    meter.track(t)
                meter.sample()
                return out

        self.mode = _Mode()

    def track(self, t) -> None:
        """Count ``t``'s storage; a DTensor wrapper's own storage reports its global size, so
        its local tensors (made inside the DTensor op, where this mode does not see them) count."""
        import torch
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass
        if not isinstance(t, torch.Tensor) or not t.is_cpu:
            return
        if is_traceable_wrapper_subclass(t):
            for name in t.__tensor_flatten__()[0]:
                self.track(getattr(t, name))
            return
        st = t.untyped_storage()
        ref = self._live.get(st._cdata)
        if ref is None or ref() is None:
            # a storage freed between two ops (a Python-side `grad = None`) leaves a dead entry whose
            # address the next allocation may reuse: replace it, or the new storage goes uncounted
            self._live[st._cdata] = weakref.ref(st)

    def sample(self) -> int:
        total, dead = 0, []
        for key, ref in self._live.items():
            st = ref()
            if st is None:
                dead.append(key)
            else:
                total += st.nbytes()
        for key in dead:
            del self._live[key]
        self.total = total
        self.peak = max(self.peak, total)
        return total

    def reset_peak(self) -> None:
        self.peak = self.sample()


def _checkpoint_blocks(model, every: int) -> None:
    """torchtitan's block checkpointing: ``ptd_checkpoint_wrapper(block, preserve_rng_state=False)``
    on blocks N, 2N, ... (1-based; every block for N = 1), _apply_ac_to_transformer_block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    layers = model.model.layers
    for i in range(len(layers)):
        if every <= 1 or (i + 1) % every == 0:
            layers[i] = checkpoint_wrapper(layers[i], preserve_rng_state=False)


def _shard(model, mesh, reshard: bool = True):
    """torchtitan's grouping (55e42c0d models/llama3/infra/parallelize.py:395-414): the input
    embedding, each decoder layer, [norm, lm_head] (never resharded after forward) and the
    root; ``reshard`` is reshard_after_forward of the others (False under PP). ``model`` has
    ``embed_tokens``, ``layers``, ``norm`` and ``lm_head`` where present (a transformers
    causal LM through ``model.model``, or a ``_stage`` chunk)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    body = getattr(model, "model", model)
    if getattr(body, "embed_tokens", None) is not None:
        fully_shard(body.embed_tokens, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    for layer in body.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    if getattr(body, "norm", None) is not None:
        fully_shard([body.norm, model.lm_head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    return model


def _stage(model, lo: int, hi: int, first: bool, last: bool):
    """One pipeline chunk of a transformers Llama: the embedding (first), decoder layers
    ``lo:hi`` with the rotary table, and the final norm and output layer (last); its forward
    maps token ids or a hidden state to a hidden state or the logits (torchtitan's chunks,
    torchtitan/distributed/pipeline_parallel.py, keep the same modules)."""
    import torch

    class Chunk(torch.nn.Module):
        def __init__(self, body, head):  # modules as arguments: a closure would keep the whole model alive
            super().__init__()
            self.embed_tokens = body.embed_tokens if first else None
            self.layers = torch.nn.ModuleList(list(body.layers)[lo:hi])
            self.rotary_emb = body.rotary_emb
            self.norm = body.norm if last else None
            self.lm_head = head if last else None

        def forward(self, x):
            h = self.embed_tokens(x) if self.embed_tokens is not None else x
            pos = torch.arange(h.shape[1]).unsqueeze(0)
            rotary = self.rotary_emb(h, pos)
            for layer in self.layers:
                h = layer(h, position_embeddings=rotary, position_ids=pos)
            return self.lm_head(self.norm(h)) if self.norm is not None else h

    return Chunk(model.model, model.lm_head)


def _loss(pred, labels):
    """torchtitan's cross_entropy_loss: the flattened logits upcast to fp32."""
    import torch
    return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def _step(model, ids, case: Case, meter: StorageMeter) -> int:
    """One training step's forward and backward (micro-batches per ``case``); returns the total
    held after the last backward, before any final reduce. ``use_cache=False``: torchtitan's
    modules keep no KV cache, and transformers' DynamicCache would append a recomputed layer's
    keys and values a second time under checkpointing (measured: +12.8 MB at w2 (8, 256))."""
    if case.mode == "fsdp":  # torchtitan's loop: every micro-batch's backward reduce-scatters (train.py:550-561)
        for _ in range(case.microbatches):
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        return meter.sample()
    if case.mode == "tp":  # torchtitan's loss on vocab-sharded logits (loss_parallel, its default)
        from torch.distributed.tensor.parallel import loss_parallel
        logits = model(input_ids=ids, use_cache=False).logits  # a Shard(-1) DTensor
        with loss_parallel():
            _loss(logits, ids).backward()
        return meter.sample()
    from torch.distributed.fsdp import FSDPModule
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for _ in range(case.microbatches):  # PipelineStage.backward_maybe_with_nosync, FSDP branch
        model.set_is_last_backward(False)
        model.set_reshard_after_backward(False)
        model.set_requires_gradient_sync(False)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    held = meter.sample()
    model.set_is_last_backward(True)  # PipelineStage.perform_reduce_grad
    model.set_reshard_after_backward(True)
    model.set_requires_gradient_sync(True)
    for g in groups:
        group = g._get_fsdp_state()._fsdp_param_group
        if group is not None:
            group.post_backward()
    model._get_fsdp_state()._root_post_backward_final_callback()
    return held


MEASURED_STEPS = 2
"""Steps measured after the first; each rank records the smallest peak. gloo runs collectives on
its own threads, so when FSDP's buffers are released depends on thread timing: under load one
more sharded output can still be alive (+628,832 B once at world 4 in a CI run, 4.7 %). The
smallest peak is the timing where every collective has finished when FSDP waits for it."""


def _measured_peak(meter: StorageMeter, opt, step) -> int:
    """The largest total while ``step()`` runs, from the state after ``opt.zero_grad(set_to_none=True)``
    (how torchtitan begins each step): the parameters and the optimizer's moments."""
    opt.zero_grad(set_to_none=True)
    meter.reset_peak()
    step()
    return meter.peak


def _states_base_peak(meter: StorageMeter, opt, step) -> tuple[int, int, int]:
    """A first step and optimizer step, then (``states`` after it, ``base`` after zero_grad, the
    smallest ``peak`` of MEASURED_STEPS more steps)."""
    step()
    opt.step()
    states = meter.sample()
    opt.zero_grad(set_to_none=True)
    base = meter.sample()
    return states, base, min(_measured_peak(meter, opt, step) for _ in range(MEASURED_STEPS))


def _measure_pp(rank: int, case: Case) -> Measured:
    """The ``pp`` mode: a real pipeline schedule over (pp, dp) ranks (module docstring)."""
    import torch
    from torch.distributed import pipelining
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, LlamaConfig
    dp = case.world // case.pp
    mesh = init_device_mesh("cpu", (case.pp, dp), mesh_dim_names=("pp", "dp"))
    pp_rank, chunks = mesh["pp"].get_local_rank(), case.pp * case.vpp
    per = PP_CONFIG["num_hidden_layers"] // chunks
    meter = StorageMeter()
    torch.manual_seed(0)
    b, s = case.tokens
    ids = torch.randint(0, PP_CONFIG["vocab_size"], (case.microbatches * b, s))
    ours = [pp_rank + c * case.pp for c in range(case.vpp)]
    with meter.mode:
        cfg = LlamaConfig(**{k: v for k, v in PP_CONFIG.items() if k != "model_type"})
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
        mods = [_shard(_stage(model, v * per, (v + 1) * per, v == 0, v == chunks - 1), mesh["dp"], reshard=False)
                for v in ours]
        del model
        stages = [pipelining.PipelineStage(m, v, chunks, torch.device("cpu"), group=mesh["pp"].get_group())
                  for m, v in zip(mods, ours)]
        cls = getattr(pipelining, SCHEDULES[case.schedule])
        sched = cls(stages if case.vpp > 1 else stages[0], n_microbatches=case.microbatches, loss_fn=_loss)
        opt = torch.optim.AdamW([p for m in mods for p in m.parameters()], lr=1e-4, foreach=False)

        def step():
            args = (ids,) if 0 in ours else ()
            kw = {"target": ids, "losses": []} if chunks - 1 in ours else {}
            sched.step(*args, return_outputs=False, **kw)

        states, base, peak = _states_base_peak(meter, opt, step)
    return Measured(case.name, rank, states, base, peak, stage=pp_rank)


def _measure(rank: int, case: Case) -> Measured:
    if case.mode == "pp":
        return _measure_pp(rank, case)
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, LlamaConfig
    from ndplan.trace.tp import parallelize
    mesh = init_device_mesh("cpu", (case.world // case.tp, case.tp), mesh_dim_names=("dp", "tp"))
    meter = StorageMeter()
    torch.manual_seed(0)
    b, s = case.tokens
    ids = torch.randint(0, case.config["vocab_size"], (b, s))
    if case.source == "torchtitan":
        from ndplan.trace import titan
        return Measured(case.name, rank, *titan.measure(case, mesh, meter, ids))
    with meter.mode:
        cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
        if case.float8:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=case.float8_all_gather),
                                       module_filter_fn=lambda mod, fqn: fqn != "lm_head")
        if case.tp > 1:  # torchtitan applies TP before FSDP (models/llama3/infra/parallelize.py)
            parallelize(model, mesh["tp"], "sp", vocab_parallel=True)
        if case.ac_every:  # then activation checkpointing, then FSDP (parallelize_llama)
            _checkpoint_blocks(model, case.ac_every)
        model = _shard(model, mesh["dp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        _step(model, ids, case, meter)
        opt.step()
        states = meter.sample()
        opt.zero_grad(set_to_none=True)
        base = meter.sample()
        held = []
        peak = min(_measured_peak(meter, opt, lambda: held.append(_step(model, ids, case, meter)))
                   for _ in range(MEASURED_STEPS))
    return Measured(case.name, rank, states, base, peak, held[-1] if case.mode == "fsdp-pp" else 0)


def _worker(rank: int, world: int, port: int, cases: list[Case], out_dir: str) -> None:
    import json
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = [asdict(_measure(rank, c)) for c in cases]
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rows))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(cases: list[Case]) -> list[Measured]:
    """Every case on a fresh gloo group per world size; one row per case and rank."""
    import json
    import torch.multiprocessing as mp
    out: list[Measured] = []
    for world in sorted({c.world for c in cases}):
        group = [c for c in cases if c.world == world]
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(world, _free_port(), group, tmp), nprocs=world, join=True)
            for r in range(world):
                out += [Measured(**row) for row in json.loads(Path(tmp, f"rank{r}.json").read_text())]
    return out


def predicted(case: Case) -> dict[str, int]:
    """ndplan's bytes for ``case`` on one rank, from the fsdp profile's Terms (engine hf, the
    same states, with gloo's reduce-scatter copy, ``gloo_engine``): ``states`` = weights + gradients + optimizer states as ``static_terms``
    gives them (after the step all gradients exist), ``peak`` = the estimate's allocated
    line; for ``fsdp-pp`` the gather Term in its pipelined form over all the model's
    parameters replaces the per-layer one, since the measured stage holds the whole model."""
    import sympy as sp
    import ndplan
    from ndplan import symbols as S
    from ndplan.catalog.model import model_from_config
    from ndplan.estimate import strategy_point
    from ndplan.export.torchtitan import layer_sac_count
    from ndplan.formulas import params as P
    from ndplan.formulas.fsdp_phases import pp_final_reduce, pp_group_grads
    from ndplan.formulas.local import device_params
    from ndplan.formulas.memory import gather_term, graph_constants_term, loss_logits
    from ndplan.formulas.states import static_terms
    from ndplan.structure import structure
    from ndplan.symbols import model_symbols
    if case.mode == "pp":
        return _predicted_pp(case)
    spec = model_from_config(dict(case.config), "runtime", "ndplan.trace.runtime")
    if case.source == "torchtitan":
        from ndplan.trace.titan import TITAN_SETTINGS
        engine = gloo_engine("fsdp", TITAN_SETTINGS | ({"loss_chunks": case.loss_chunks} if case.loss_chunks else {}))
    else:  # the harness syncs every micro-batch as torchtitan does, not under the Trainer's no_sync
        engine = gloo_engine("hf", ({"float8_all_gather": 1} if case.float8 and case.float8_all_gather else {})
                             | ({"grads_accumulate_unsharded": 0} if case.microbatches > 1 else {}))
    M, eng = model_symbols(spec), ndplan.engines.profile(engine)
    b, s = case.tokens
    dp = case.world // case.tp
    wrapped = layer_sac_count(spec.num_hidden_layers, case.ac_every) if case.ac_every else 0
    rec = dict(recompute="full", recompute_layers=None if wrapped == spec.num_hidden_layers else wrapped) if wrapped else {}
    if case.op_sac:
        rec = dict(recompute="selective")
    # fsdp-pp: the stage reduces once after its last micro-batch (requires_gradient_sync False), so its
    # gradients are the pipelined Terms' below, not pp 1's accumulated sharded ones (fsdp_phases.accumulating):
    # the base is the one-micro-batch estimate
    m = 1 if case.mode == "fsdp-pp" else case.microbatches
    strat = ndplan.Strategy(dp=dp, tp=case.tp, zero=3, engine=engine, mbs=b, seq=s, gbs=dp * b * m, **rec)
    st = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), strat).per_stage[0]
    dense, expert = device_params(P.embedding_pieces(spec, M) + P.head_pieces(spec, M, tied_copy=False)
                                  + [pc for k in spec.layer_kinds for pc in P.layer_pieces(spec, M, k)])
    emb = device_params(P.embedding_pieces(spec, M))[0]

    def value(expr, at) -> float:
        return float(sp.sympify(expr).subs(strategy_point(at)).subs({S.stage: 0}))

    states = static_terms(spec, structure(spec, strat), eng, dense, expert, emb)
    if case.source == "torchtitan":  # its RoPE tables are buffers of the model (trace.titan.TITAN_SETTINGS)
        states.append(graph_constants_term(spec, M, structure(spec, strat), eng))
    out = {"states": int(round(sum(value(t.expr, strat) for t in states if t.key != "mem.graph_constants"
                                   or case.source == "torchtitan"))),
           "peak": st["allocated_bytes"]}
    if case.mode == "fsdp-pp":
        # one micro-batch held at a time: the whole model's unsharded stage (the pipelined gather Term
        # without activations to sit beside) replaces the per-layer gather, and the pipelined exclusive
        # transients (a group's 16-bit gradients, the final reduce after the activations) join the loss's
        piped = ndplan.Strategy(dp=case.world, pp=2, zero=3, engine=engine, mbs=b, seq=s, gbs=2 * case.world * b)
        view = structure(spec, piped)
        term = gather_term(spec, M, view, eng, dense, expert, sp.Integer(0))
        acts, transient = st["terms"]["mem.activations"], st["terms"].get("mem.transient", 0)
        logits = value(loss_logits(spec, M, structure(spec, strat)), strat)  # no backward reduce-scatter phase
        exclusive = max(logits, value(pp_group_grads(spec, M, view), piped),
                        value(pp_final_reduce(spec, M, view), piped) - acts)
        out["peak"] = int(st["allocated_bytes"] - st["terms"]["mem.zero3_gather"] - transient
                          + value(term.expr, piped) + exclusive)
    return out


def gloo_engine(name: str, settings: dict | None = None) -> str:
    """``name`` (with engine ``settings``) as it runs on this harness's gloo backend: its
    reduce-scatter adds a full fp32 copy of the input (engines.GLOO_REDUCE_SCATTER_COPY_BYTES),
    which NCCL does not."""
    import ndplan
    return ndplan.engines.derive(name, (settings or {}) | {
        "reduce_scatter_copy_bytes": ndplan.engines.GLOO_REDUCE_SCATTER_COPY_BYTES})


def _predicted_pp(case: Case) -> dict[str, list[int]]:
    """ndplan's allocated peak per pipeline rank for a ``pp`` case (engine hf: the states and
    the fsdp profile's pipelining Terms; transformers' activations)."""
    import ndplan
    from ndplan.catalog.model import model_from_config
    spec = model_from_config(dict(PP_CONFIG), "runtime-pp", "ndplan.trace.runtime")
    b, s = case.tokens
    dp = case.world // case.pp
    strat = ndplan.Strategy(dp=dp, pp=case.pp, vpp=case.vpp, schedule=case.schedule, zero=3,
                            engine=gloo_engine("hf"), mbs=b, seq=s, gbs=dp * b * case.microbatches)
    est = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), strat)
    return {"peak": [st["allocated_bytes"] for st in est.per_stage]}
