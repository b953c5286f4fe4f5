"""Strategy: one point of the parallel-training design space.

Field checks (types, vocabularies, ranges) are here; the validity rules that relate
fields (and the model) are the one table of rules.py, which the space generator and
PPB's Pipeline evaluate too. Every failure raises NdplanError naming the field, the
value and the fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ndplan import limits, rules
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError
from ndplan.layouts import slices

from ndplan.vocab import ENGINES, GRAD_DTYPES, RECOMPUTE_MODES, SCHEDULES, WEIGHT_DTYPES, ZERO_LEVELS


@dataclass(frozen=True, kw_only=True)
class Strategy:
    dp: int = 1
    """Data-parallel degree (replicas x shards)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline stages."""
    cp: int = 1
    """Context-parallel degree."""
    ep: int = 1
    """Expert-parallel degree (carved from dp*cp*tp ranks)."""
    etp: int = 1
    """Expert tensor-parallel degree."""
    vpp: int = 1
    """Virtual pipeline chunks per stage."""
    mbs: int = 1
    """Micro-batch size, sequences."""
    gbs: int = 1
    """Global batch, sequences."""
    seq: int = 4096
    """Sequence length, tokens."""
    zero: int = 1
    """0: nothing sharded on dp; 1: optimizer states (+fp32 master); 2: + gradients; 3: + weights (FSDP)."""
    sp: bool = True
    """Sequence parallelism on the TP group (Megatron-SP)."""
    recompute: str = "none"
    """none | selective (attention core) | full (layer input only)."""
    recompute_layers: int | tuple[int, ...] | None = None
    """Apply ``recompute`` only to the first N layers of each stage chunk, the others
    store everything (Megatron ``--recompute-method block --recompute-num-layers N``;
    MindFormers per-stage ``recompute``/``select_recompute`` lists). One int for every
    stage, or one count per stage. With vpp > 1 the count is per chunk, or the stage's
    total dealt over its chunks when the engine sets ``recompute_count_per_stage``."""
    schedule: str = "1f1b"
    engine: str = "megatron"
    flash_attention: bool = True
    layers_per_stage: tuple[int, ...] | None = None
    """Uneven split: decoder layers per (virtual) stage, pp*vpp entries in model order."""
    grad_dtype: str = "fp32"
    """Gradient (accumulation) dtype: fp32 (Megatron main grads) or bf16."""
    weight_dtype: str = "auto"
    """Persistent weights: auto (the engine's choice), fp32, bf16 or fp8."""
    offload_optimizer: bool = False
    """Optimizer states and fp32 master weights on host memory (reported separately)."""
    order: str = "tp-cp-ep-dp-pp"
    """Rank placement, innermost axis first (Megatron-Core RankGenerator order); decides which
    groups stay inside a node."""

    @property
    def m(self) -> int:
        """Micro-batches per step."""
        return micro_batches(self.gbs, self.dp, self.mbs)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def nrec(self):
        """Kernel value of the nrec symbol: an int, or one count per stage (a tuple)."""
        return 0 if self.recompute_layers is None else self.recompute_layers

    def as_dict(self) -> dict:
        d = asdict(self)
        d["m"] = self.m
        d["layers_per_stage"] = list(self.layers_per_stage) if self.layers_per_stage else None
        if isinstance(self.recompute_layers, tuple):
            d["recompute_layers"] = list(self.recompute_layers)
        return d

    def __post_init__(self):
        for f_, hi in (("dp", limits.MAX_DEVICES), ("tp", limits.MAX_DEVICES), ("pp", limits.MAX_DEVICES),
                       ("cp", limits.MAX_DEVICES), ("ep", limits.MAX_DEVICES), ("etp", limits.MAX_DEVICES),
                       ("vpp", limits.MAX_LAYERS), ("mbs", limits.MAX_BATCH), ("gbs", limits.MAX_BATCH),
                       ("seq", limits.MAX_SEQ)):
            v = getattr(self, f_)
            if isinstance(v, bool) or not isinstance(v, int):
                raise NdplanError(f_, v, "not an integer", f"give a whole number in 1..{hi:,}")
            limits.count(f_, v, 1, hi)
        if self.world > limits.MAX_DEVICES:
            raise NdplanError("dp", self.dp, f"dp*tp*pp*cp = {self.world:,} devices exceeds {limits.MAX_DEVICES:,}",
                              "lower a degree")
        for f_ in ("sp", "flash_attention", "offload_optimizer"):
            if not isinstance(getattr(self, f_), bool):
                raise NdplanError(f_, getattr(self, f_), "not a boolean", "give True or False")
        if isinstance(self.zero, bool) or self.zero not in ZERO_LEVELS:
            raise NdplanError("zero", self.zero, "unknown ZeRO level", "give 0, 1, 2 or 3")
        if self.recompute not in RECOMPUTE_MODES:
            raise NdplanError("recompute", self.recompute, "unknown mode", f"choose one of {', '.join(RECOMPUTE_MODES)}")
        if self.schedule not in SCHEDULES:
            raise NdplanError("schedule", self.schedule, "unknown schedule", f"choose one of {', '.join(SCHEDULES)}")
        from ndplan.engines import profile
        if not isinstance(self.engine, str):
            raise NdplanError("engine", self.engine, "not an engine name", f"choose one of {', '.join(ENGINES)}")
        profile(self.engine)  # a base name or one derived with --set
        if self.grad_dtype not in GRAD_DTYPES:
            raise NdplanError("grad_dtype", self.grad_dtype, "unknown dtype", "give fp32 or bf16")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise NdplanError("weight_dtype", self.weight_dtype, "unknown dtype", "give auto, fp32, bf16 or fp8")
        if not isinstance(self.order, str) or sorted(self.order.split("-")) != sorted(("tp", "cp", "ep", "dp", "pp")):
            raise NdplanError("order", self.order, "not a placement order",
                              "give a permutation of tp-cp-ep-dp-pp, innermost first")
        if self.recompute_layers is not None:
            counts = self.recompute_layers if isinstance(self.recompute_layers, tuple) else (self.recompute_layers,)
            for x in counts:
                if isinstance(x, bool) or not isinstance(x, int):
                    raise NdplanError("recompute_layers", self.recompute_layers, "counts must be integers",
                                      "give whole numbers >= 0")
                limits.count("recompute_layers", x, 0, limits.MAX_LAYERS, "a layer count")
            if isinstance(self.recompute_layers, tuple) and len(counts) != self.pp:
                raise NdplanError("recompute_layers", list(counts), f"{len(counts)} counts for pp={self.pp} stages",
                                  "give one count per stage or one int")
            if self.recompute == "none":
                raise NdplanError("recompute_layers", self.recompute_layers, "given with recompute none",
                                  "set --recompute selective or full too")
        rules.check(self, ("strategy", "schedule", "engine"))

    def check(self, model: ModelSpec, gpus: int | None = None) -> None:
        """Divisibility rules against a model and device count."""
        rules.check(rules.WithModel(self, model, gpus), ("model", "engine_model"))
        chunks = slices(self.schedule, self.pp, self.vpp)  # pp under dualpipe: each slice on two stages
        L = model.num_hidden_layers
        if self.layers_per_stage is not None:
            lps = tuple(self.layers_per_stage)
            if len(lps) != chunks:
                raise NdplanError("layers_per_stage", list(lps), f"{len(lps)} entries for {chunks} model slices "
                                  f"({'pp' if chunks == self.pp and self.vpp > 1 else 'pp*vpp'})",
                                  f"give {chunks} layer counts")
            if any(x < 0 for x in lps) or sum(lps) != L:
                raise NdplanError("layers_per_stage", list(lps), f"entries sum to {sum(lps)}",
                                  f"give counts >= 0 that sum to num_hidden_layers={L}")
        if self.recompute_layers is not None:
            counts = self.recompute_layers if isinstance(self.recompute_layers, tuple) else (self.recompute_layers,)
            if max(counts) > L:
                raise NdplanError("recompute_layers", self.recompute_layers, f"exceeds num_hidden_layers={L}",
                                  f"give at most {L}")
        model.warn_long_seq(self.seq)


def micro_batches(gbs, dp, mbs):
    """Micro-batches per step m = gbs / (dp*mbs) (each replica runs gbs/dp sequences in
    micro-batches of mbs); integer division, on numbers or numpy arrays."""
    return gbs // (dp * mbs)
