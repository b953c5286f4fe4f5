"""A serving instance's layout and weight recipe, checked against the model (one-line errors).

Layout (``ServeLayout``): an instance runs on ``tp * pp`` devices. ``tp`` devices share each
pipeline stage; the attention runs tensor-parallel over ``tp / dp_attention`` of them and
data-parallel over ``dp_attention`` groups, each serving its own requests (SGLang
``--enable-dp-attention`` with ``--dp``; vLLM ``--data-parallel-size`` D with
``--tensor-parallel-size`` T and ``--enable-expert-parallel`` is tp = D x T, dp_attention = D;
TensorRT-LLM ``enable_attention_dp``: dp_attention = tp). MLPs and experts are split over all
``tp`` devices of the stage; ``ep`` (dividing tp) only says how the experts are split (whole
experts over ep groups, each expert over tp / ep devices), which changes the communication and
not the bytes a device holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan import limits
from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError

WEIGHT_DTYPES = ("bf16", "fp8", "int4")
A2A_BACKENDS = ("nccl", "deepep")
"""The MoE dispatch/combine: ``nccl`` (an all-to-all, each token sent once per destination rank,
16-bit) or ``deepep`` (DeepEP's normal kernels: one RDMA copy per destination node, forwarded over
NVLink; fp8 dispatch under fp8 weights; serve/time.py ``_deepep_seconds``)."""
KV_DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class ServeLayout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp_attention: int = 1
    dense_with_attention: bool = False
    """Dense MLPs and shared experts run with the attention, over the attention-TP group and once per
    attention-DP group (engines.ServeEngine.dense_with_attention_dp), not over all tp devices."""
    a2a: str = "nccl"
    """The MoE all-to-all backend (``A2A_BACKENDS``); used only when ep > 1."""

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    @property
    def attention_tp(self) -> int:
        return self.tp // self.dp_attention

    def check(self, spec: ModelSpec) -> "ServeLayout":
        """This layout, or a one-line NdplanError naming the degree that does not fit ``spec``."""
        for name in ("tp", "pp", "ep", "dp_attention"):
            limits.count(f"--{name.replace('_', '-')}", getattr(self, name), 1, limits.MAX_DEVICES)
        if self.a2a not in A2A_BACKENDS:
            raise NdplanError("--ep-a2a", self.a2a, "not an all-to-all backend ndplan models",
                              f"one of {', '.join(A2A_BACKENDS)}")
        if self.tp % self.dp_attention:
            raise NdplanError("--dp-attention", self.dp_attention, f"does not divide --tp {self.tp}",
                              "give a divisor of tp (the attention runs tensor-parallel over tp / dp_attention)")
        if self.tp % self.ep:
            raise NdplanError("--ep", self.ep, f"does not divide --tp {self.tp}",
                              "give a divisor of tp (experts are split over the stage's tp devices)")
        if self.ep > 1 and not spec.is_moe:
            raise NdplanError("--ep", self.ep, f"{spec.name} has no experts", "leave --ep at 1 for a dense model")
        if spec.is_moe and spec.num_experts % self.ep:
            raise NdplanError("--ep", self.ep, f"does not divide {spec.name}'s {spec.num_experts} experts",
                              "give a divisor of the expert count")
        if self.pp > spec.num_hidden_layers:
            raise NdplanError("--pp", self.pp, f"above {spec.name}'s {spec.num_hidden_layers} layers",
                              "give at most one stage per layer")
        heads, kv, atp = spec.num_attention_heads, spec.num_key_value_heads, self.attention_tp
        if heads % atp:
            raise NdplanError("--tp", self.tp, f"attention tp {atp} does not divide {spec.name}'s {heads} heads",
                              "give a tp (or dp_attention) whose tp / dp_attention divides the heads")
        if not spec.is_mla and kv % atp and atp % kv:
            raise NdplanError("--tp", self.tp, f"attention tp {atp} and {spec.name}'s {kv} KV heads: neither divides "
                              "the other", "give an attention tp that divides the KV heads or is a multiple of them")
        return self


@dataclass(frozen=True)
class WeightRecipe:
    """How the weights are stored: ``dtype`` of the decoder layers' linear weights (bf16, fp8,
    int4 weight-only with ``group`` elements per 16-bit scale and 4-bit zero point), the
    pieces kept 16-bit beside the always-16-bit embedding, head, norms and router
    (``keep_pieces``: piece-name prefixes, e.g. "attn" for Meta's Llama 3.1 FP8, whose attention
    stays bf16), the layers kept whole in 16-bit (``keep_layers``: indices, e.g. the first and
    last) and, for fp8, per-row scales (``channel_scales``)."""

    dtype: str = "bf16"
    group: int = 128
    keep_pieces: tuple[str, ...] = ()
    keep_layers: tuple[int, ...] = ()
    channel_scales: bool = False
    """fp8 with one fp32 scale per output row (fbgemm_fp8 row-wise, compressed-tensors channel-wise)
    instead of one per tensor (ModelOpt FP8)."""

    def check(self) -> "WeightRecipe":
        if self.dtype not in WEIGHT_DTYPES:
            raise NdplanError("--weight-dtype", self.dtype, "not a weight dtype ndplan serves",
                              f"one of {', '.join(WEIGHT_DTYPES)}")
        limits.count("weight group", self.group, 1, 1 << 20)
        return self
