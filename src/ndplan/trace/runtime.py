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
  stage.py:1164-1191). The schedule itself is not run: one stage, no send/recv.

Recorded per rank, in bytes: ``states`` (after the first optimizer step: sharded fp32
parameters, sharded fp32 gradients, Adam moments), ``base`` (after ``zero_grad``: parameters
and moments), ``peak`` (largest total during the second step's forward and backward) and,
in ``fsdp-pp``, ``held`` (total after the last micro-batch's backward, before the reduce).
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
          "max_position_embeddings": 64, "tie_word_embeddings": False, "rms_norm_eps": 1e-5,
          "attention_dropout": 0.0}
"""The measured model: every size divisible by 8, so no FSDP shard is padded at world <= 8;
parameters (about 2.1 M) dwarf the activations of ``TOKENS``."""

TOKENS = (1, 4)
"""(micro-batch, sequence) of every step: a few KiB of activations beside MiB of states."""


@dataclass(frozen=True)
class Case:
    name: str
    mode: str = "fsdp"
    world: int = 2
    microbatches: int = 1


@dataclass(frozen=True)
class Measured:
    case: str
    rank: int
    states: int
    base: int
    peak: int
    held: int = 0


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
        self._live.setdefault(st._cdata, weakref.ref(st))

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


def _shard(model, mesh):
    """torchtitan's grouping (55e42c0d models/llama3/infra/parallelize.py:395-414)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    body = model.model
    fully_shard(body.embed_tokens, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    for layer in body.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard([body.norm, model.lm_head], mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _step(model, ids, case: Case, meter: StorageMeter) -> int:
    """One training step's forward and backward (micro-batches per ``case``); returns the total
    held after the last backward, before any final reduce."""
    if case.mode == "fsdp":
        model(input_ids=ids, labels=ids).loss.backward()
        return meter.sample()
    from torch.distributed.fsdp import FSDPModule
    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for _ in range(case.microbatches):  # PipelineStage.backward_maybe_with_nosync, FSDP branch
        model.set_is_last_backward(False)
        model.set_reshard_after_backward(False)
        model.set_requires_gradient_sync(False)
        model(input_ids=ids, labels=ids).loss.backward()
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


def _measure(rank: int, case: Case) -> Measured:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, LlamaConfig
    mesh = init_device_mesh("cpu", (case.world,))
    meter = StorageMeter()
    torch.manual_seed(0)
    b, s = TOKENS
    ids = torch.randint(0, CONFIG["vocab_size"], (b, s))
    with meter.mode:
        cfg = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
        model = _shard(AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa"), mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        _step(model, ids, case, meter)
        opt.step()
        states = meter.sample()
        opt.zero_grad(set_to_none=True)
        base = meter.sample()
        meter.reset_peak()
        held = _step(model, ids, case, meter)
        peak = meter.peak
    return Measured(case.name, rank, states, base, peak, held if case.mode == "fsdp-pp" else 0)


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
    same states): ``states`` = weights + gradients + optimizer states as ``static_terms``
    gives them (after the step all gradients exist), ``peak`` = the estimate's allocated
    line; for ``fsdp-pp`` the gather Term in its pipelined form over all the model's
    parameters replaces the per-layer one, since the measured stage holds the whole model."""
    import sympy as sp
    import ndplan
    from ndplan import symbols as S
    from ndplan.catalog.model import model_from_config
    from ndplan.estimate import strategy_point
    from ndplan.formulas import params as P
    from ndplan.formulas.memory import device_params, gather_term, static_terms
    from ndplan.structure import structure
    from ndplan.symbols import model_symbols
    spec = model_from_config(dict(CONFIG), "runtime", "ndplan.trace.runtime")
    M, eng = model_symbols(spec), ndplan.engines.profile("hf")
    b, s = TOKENS
    strat = ndplan.Strategy(dp=case.world, zero=3, engine="hf", mbs=b, seq=s, gbs=case.world * b * case.microbatches)
    st = ndplan.estimate(spec, ndplan.load_hardware("h100-sxm"), strat).per_stage[0]
    dense, expert = device_params(P.embedding_pieces(spec, M) + P.head_pieces(spec, M, tied_copy=False)
                                  + [pc for k in spec.layer_kinds for pc in P.layer_pieces(spec, M, k)])
    emb = device_params(P.embedding_pieces(spec, M))[0]

    def value(expr, at) -> float:
        return float(sp.sympify(expr).subs(strategy_point(at)).subs({S.stage: 0}))

    states = static_terms(spec, structure(spec, strat), eng, dense, expert, emb)
    out = {"states": int(round(sum(value(t.expr, strat) for t in states if t.key != "mem.graph_constants"))),
           "peak": st["allocated_bytes"]}
    if case.mode == "fsdp-pp":
        piped = ndplan.Strategy(dp=case.world, pp=2, zero=3, engine="hf", mbs=b, seq=s, gbs=2 * case.world * b)
        term = gather_term(spec, M, structure(spec, piped), eng, dense, expert, sp.Integer(0))
        out["peak"] = int(st["allocated_bytes"] - st["terms"]["mem.zero3_gather"] + value(term.expr, piped))
    return out
