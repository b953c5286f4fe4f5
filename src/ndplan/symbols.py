"""The one place ndplan makes SymPy symbols.

Vocabulary (../shared/DESIGN.md): the same names are used for symbols, YAML keys,
CLI flags and JSON keys.

Strategy symbols (positive integers):
    dp    data-parallel degree (replicas x shards); ZeRO level says what is sharded on it
    tp    tensor-parallel degree (SP shards the residual stream over the same group)
    pp    pipeline stages
    vpp   virtual chunks per stage (interleaving)
    cp    context-parallel degree (sequence split)
    ep    expert-parallel degree, carved from dp*cp*tp ranks
    etp   expert tensor-parallel degree
    mbs   micro-batch size (sequences)
    m     micro-batches per step = gbs / (dp * mbs)
    seq   sequence length (tokens)
    stage pipeline stage index, 0 .. pp-1
    nrec  layers per stage chunk that are fully recomputed ("recompute the first N")
    first_layers, last_layers
          decoder layers of stage 0 and of stage pp-1 in an uneven "ends" layout
          (layouts.py; the middle stages hold the rest evenly); kernels of even
          layouts do not read them

Model symbols (used as symbols only with ``explain --symbolic``; otherwise the
model's integers are substituted at build time): h, L, a, kv, d, f, V, ...
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import sympy as sp

from ndplan import argnames


def _pos(name: str) -> sp.Symbol:
    return sp.Symbol(name, positive=True, integer=True)


def _nonneg(name: str) -> sp.Symbol:
    return sp.Symbol(name, nonnegative=True, integer=True)


dp = _pos("dp")
tp = _pos("tp")
pp = _pos("pp")
vpp = _pos("vpp")
cp = _pos("cp")
ep = _pos("ep")
etp = _pos("etp")
mbs = _pos("mbs")
m = _pos("m")
seq = _pos("seq")
stage = _nonneg("stage")
nrec = _nonneg("nrec")
first_layers = _nonneg("first_layers")
last_layers = _nonneg("last_layers")


def _posreal(name: str) -> sp.Symbol:
    return sp.Symbol(name, positive=True)


# Hardware symbols: kernel arguments whose values come from a Hardware entry
# (catalog.hardware.Hardware.kernel_values), so one compiled kernel serves every device
# and `--set name=value` needs no recompilation.
peak = _posreal("peak")            #: dense tensor-core FLOP/s of the GEMMs' dtype (fp8 or 16-bit)
peak_bf16 = _posreal("peak_bf16")  #: dense 16-bit FLOP/s: attention core, router, output layer
eff_gemm = _posreal("eff_gemm")    #: achieved / 16-bit peak FLOP/s of a training step's GEMMs
eff_gemm8 = _posreal("eff_gemm8")  #: achieved / FP8 peak FLOP/s of fp8 GEMMs (read only when fp8_gemm = 1)
eff_attn = _posreal("eff_attn")    #: achieved / 16-bit peak FLOP/s of the fused attention core, long sequences
hbm_bytes_per_s = _posreal("hbm_bytes_per_s")  #: HBM bandwidth, B/s (the capacity is Hardware.hbm_gib)
eff_hbm = _posreal("eff_hbm")      #: achieved / nominal HBM bandwidth of streaming kernels
bw_intra = _posreal("bw_intra")    #: per-device unidirectional intra-node bandwidth, B/s
bw_inter = _posreal("bw_inter")    #: per-device unidirectional NIC bandwidth, B/s
eff_intra = _posreal("eff_intra")  #: collective bus bandwidth / nominal, intra-node
eff_inter = _posreal("eff_inter")  #: collective bus bandwidth / nominal, inter-node
lat_intra = _posreal("lat_intra")  #: latency per collective step inside a node, s
lat_inter = _posreal("lat_inter")  #: latency per collective step across nodes, s
node = _posreal("node")            #: devices per node
fp8_gemm = _nonneg("fp8_gemm")     #: 1 when the layers' GEMMs run in fp8 (operands quantised), else 0

HW_SYMBOLS: tuple[sp.Symbol, ...] = tuple(globals()[n] for n in argnames.HW_ARGS)

#: Strategy symbols in the canonical argument order of compiled kernels (argnames.STRATEGY_ARGS).
STRATEGY_SYMBOLS: tuple[sp.Symbol, ...] = tuple(globals()[n] for n in argnames.STRATEGY_ARGS)
BY_NAME: dict[str, sp.Symbol] = {s.name: s for s in STRATEGY_SYMBOLS + HW_SYMBOLS}


@dataclass(frozen=True)
class ModelSymbols:
    """Model sizes as SymPy expressions: integers for a concrete model, symbols for
    ``explain --symbolic``. Field names are the short math names printed in formulas."""

    h: sp.Expr  #: hidden_size
    L: sp.Expr  #: num_hidden_layers (decoder layers, MTP excluded)
    a: sp.Expr  #: num_attention_heads
    kv: sp.Expr  #: num_key_value_heads
    d: sp.Expr  #: head_dim (query/key head dim for MHA/GQA)
    f: sp.Expr  #: intermediate_size of dense MLP layers
    V: sp.Expr  #: vocab_size
    P: sp.Expr  #: max_position_embeddings (learned positions only)
    E: sp.Expr  #: routed experts
    k: sp.Expr  #: experts per token (top-k)
    fe: sp.Expr  #: moe_intermediate_size (per routed expert)
    fs: sp.Expr  #: shared-expert intermediate size (total over shared experts)
    ql: sp.Expr  #: MLA q_lora_rank (0 = no q compression)
    kl: sp.Expr  #: MLA kv_lora_rank
    dn: sp.Expr  #: MLA qk_nope_head_dim
    dr: sp.Expr  #: MLA qk_rope_head_dim
    dv: sp.Expr  #: MLA v_head_dim

    @classmethod
    def of(cls, spec) -> "ModelSymbols":
        """A model's sizes (a catalog ModelSpec) as SymPy Integers: the catalog itself
        builds no SymPy (symbols depend on the catalog, never the other way)."""
        return cls(**{name: sp.Integer(getattr(spec, field)) for name, field in argnames.MODEL_FIELDS.items()})

    @classmethod
    def symbolic(cls) -> "ModelSymbols":
        return cls(**{f.name: _pos(f.name) for f in fields(cls)})

    def as_subs(self, concrete: "ModelSymbols") -> dict:
        """Substitution dict mapping these symbols to another instance's values."""
        return {getattr(self, f.name): getattr(concrete, f.name) for f in fields(self)
                if isinstance(getattr(self, f.name), sp.Symbol)}


def model_symbols(spec) -> ModelSymbols:
    """``ModelSymbols.of(spec)``: a catalog model's sizes as SymPy Integers."""
    return ModelSymbols.of(spec)


#: Model-size symbols in the canonical argument order of compiled kernels (kernels.model_kernel):
#: kernels are built over ModelSymbols.symbolic() and get a model's sizes as arguments.
MODEL_ARGS: tuple[sp.Symbol, ...] = tuple(getattr(ModelSymbols.symbolic(), n) for n in argnames.MODEL_ARGS)
model_arg_values = argnames.model_arg_values
assert tuple(f.name for f in fields(ModelSymbols)) == argnames.MODEL_ARGS, "ModelSymbols and argnames.MODEL_FIELDS"

