"""Strategy: one point of the parallel-training design space, and its validity rules.

Every rule raises NdplanError naming the field, the value and the fix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ndplan import limits
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError

from ndplan.vocab import ENGINES, GRAD_DTYPES, ONE_CHUNK_SCHEDULES, RECOMPUTE_MODES, SCHEDULES, WEIGHT_DTYPES, ZERO_LEVELS


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
        return self.gbs // (self.dp * self.mbs)

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
        if self.zero not in (0, 1, 2, 3):
            raise NdplanError("zero", self.zero, "unknown ZeRO level", "give 0, 1, 2 or 3")
        if self.recompute not in RECOMPUTE_MODES:
            raise NdplanError("recompute", self.recompute, "unknown mode", f"choose one of {', '.join(RECOMPUTE_MODES)}")
        if self.schedule not in SCHEDULES:
            raise NdplanError("schedule", self.schedule, "unknown schedule", f"choose one of {', '.join(SCHEDULES)}")
        from ndplan.engines import ENGINE_PROFILES  # includes profiles derived with --set
        if self.engine not in ENGINE_PROFILES:
            raise NdplanError("engine", self.engine, "unknown engine", f"choose one of {', '.join(ENGINES)}")
        if self.grad_dtype not in ("fp32", "bf16"):
            raise NdplanError("grad_dtype", self.grad_dtype, "unknown dtype", "give fp32 or bf16")
        if self.weight_dtype not in ("auto", "fp32", "bf16", "fp8"):
            raise NdplanError("weight_dtype", self.weight_dtype, "unknown dtype", "give auto, fp32, bf16 or fp8")
        if sorted(self.order.split("-")) != sorted(("tp", "cp", "ep", "dp", "pp")):
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
        if self.gbs % (self.dp * self.mbs):
            raise NdplanError("gbs", self.gbs, f"not a multiple of dp*mbs = {self.dp * self.mbs}",
                              f"give a multiple of {self.dp * self.mbs}, or change dp or mbs")
        if self.seq % self.cp:
            raise NdplanError("seq", self.seq, f"not divisible by cp={self.cp}", "change seq or cp")
        if self.vpp > 1 and self.pp == 1:
            # Megatron-core parallel_state.initialize_model_parallel: "pipeline-model-parallel
            # size should be greater than 1 with interleaved schedule" (RuntimeError)
            raise NdplanError("vpp", self.vpp, "virtual chunks need a pipeline (pp=1)", "set --pp 2 or more, or --vpp 1")
        if self.schedule in ("gpipe", "1f1b", "zb-h1") and self.vpp != 1:
            raise NdplanError("vpp", self.vpp, f"schedule {self.schedule} has one chunk per stage",
                              "use --schedule interleaved, or vpp=1")
        if self.schedule == "interleaved" and self.pp > 1 and self.vpp < 2:
            raise NdplanError("vpp", self.vpp, "the interleaved schedule needs vpp >= 2", "set --vpp 2 or more")
        if self.schedule == "zbv" and self.vpp != 2:
            raise NdplanError("vpp", self.vpp, "zbv places two chunks (a V) per stage", "set --vpp 2")
        if self.schedule == "interleaved" and self.pp > 1 and self.m % self.pp:
            # Megatron-core forward_backward_pipelining_with_interleaving: micro-batches run in
            # groups of microbatch_group_size_per_vp_stage (default pp), and a last group
            # smaller than pp is refused ("introduces dependency bubbles"), so m % pp == 0
            raise NdplanError("gbs", self.gbs, f"interleaved needs micro-batches m={self.m} a multiple of pp={self.pp} "
                              "(Megatron-LM groups micro-batches by pp)", "change gbs, mbs or dp")

    def check(self, model: ModelSpec, gpus: int | None = None) -> None:
        """Divisibility rules against a model and device count."""
        if gpus is not None and self.world != gpus:
            raise NdplanError("gpus", gpus, f"dp*tp*pp*cp = {self.dp}*{self.tp}*{self.pp}*{self.cp} = {self.world}",
                              "change a degree or --gpus so they match")
        if model.num_attention_heads % self.tp:
            raise NdplanError("tp", self.tp, f"does not divide num_attention_heads={model.num_attention_heads}",
                              "choose a tp that divides it")
        if not model.is_mla and model.num_key_value_heads % self.tp:
            raise NdplanError("tp", self.tp, f"does not divide num_key_value_heads={model.num_key_value_heads} "
                              "(Megatron rule)", "choose a tp that divides it")
        chunks = self.pp * self.vpp
        L = model.num_hidden_layers
        if L < chunks:
            raise NdplanError("pp", self.pp, f"pp*vpp={chunks} exceeds num_hidden_layers={L}", "lower pp or vpp")
        if self.layers_per_stage is not None:
            lps = tuple(self.layers_per_stage)
            if len(lps) != chunks:
                raise NdplanError("layers_per_stage", list(lps), f"{len(lps)} entries for pp*vpp={chunks} chunks",
                                  f"give {chunks} layer counts")
            if any(x < 0 for x in lps) or sum(lps) != L:
                raise NdplanError("layers_per_stage", list(lps), f"entries sum to {sum(lps)}",
                                  f"give counts >= 0 that sum to num_hidden_layers={L}")
        elif L % chunks:
            raise NdplanError("pp", self.pp, f"num_hidden_layers={L} is not divisible by pp*vpp={chunks}",
                              "give --layers-per-stage for an uneven split, or change pp/vpp")
        if self.ep > 1 or self.etp > 1:
            if not model.is_moe:
                raise NdplanError("ep", self.ep, f"model {model.name} has no experts", "use ep=1, etp=1")
            ranks = self.dp * self.cp * self.tp
            if ranks % (self.ep * self.etp):
                raise NdplanError("ep", self.ep, f"ep*etp={self.ep * self.etp} does not divide dp*cp*tp={ranks} "
                                  "(expert parallelism is carved from those ranks)", "change ep, etp or dp")
        if model.is_moe and model.num_experts % self.ep:
            raise NdplanError("ep", self.ep, f"does not divide the expert count {model.num_experts}",
                              "choose an ep that divides it")
        if self.recompute_layers is not None:
            counts = self.recompute_layers if isinstance(self.recompute_layers, tuple) else (self.recompute_layers,)
            if max(counts) > L:
                raise NdplanError("recompute_layers", self.recompute_layers, f"exceeds num_hidden_layers={L}",
                                  f"give at most {L}")
        model.warn_long_seq(self.seq)
