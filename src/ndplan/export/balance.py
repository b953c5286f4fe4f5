"""A PPB result (``ndplan balance``) as the exporters read it: decoder layers, recompute
modes and layer kinds per virtual stage, and the framework forms ``ndplan balance``
prints for a plan alone (no model or strategy: the pipeline parts of the MindFormers and
Megatron-LM translators, export/mindformers.py and export/megatron.py).

Only decoder layers count in layer numbers (not the embedding, the head or MTP layers),
as in ``Strategy.layers_per_stage`` and the frameworks' flags."""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.errors import NdplanError
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan

NOT_DECODER = ("embedding", "head", "mtp")
"""Layer kinds that are not decoder layers (ppb/export.py writes these kinds)."""
COMM_MODES = ("comm", "selective+comm")
"""The recompute modes only MindFormers expresses (``select_comm_recompute``)."""
LAYOUT_SYMBOL = {"embedding": "E", "head": "L", "mtp": "m"}
"""Layer kind -> Megatron-LM layout character (megatron/core/transformer/
pipeline_parallel_layer_layout.py ``parse_str_to_list``: E embedding, L loss, m MTP,
t decoder); every other kind is a decoder layer, t."""


DEPTH = {"full": 3, "selective+comm": 2, "selective": 1, "comm": 1, "none": 0}
"""How many of MindFormers' recompute lists count a layer of each mode (recompute, select_recompute,
select_comm_recompute: a fully recomputed layer counts in all three)."""


def prefix_ordered(modes: list[str]) -> bool:
    """The frameworks recompute a slice's first N layers per list, so along the slice the modes go
    from deepest to lightest (full, selective+comm, selective or comm, none)."""
    return all(DEPTH[a] >= DEPTH[b] for a, b in zip(modes, modes[1:]))


@dataclass(frozen=True)
class Balance:
    inst: Instance
    plan: Plan

    def _modes(self, v: int) -> list[str]:
        """The decoder layers' modes of slice v in layer order, identical layers' modes sorted deepest
        first (a permutation among identical layers changes neither time nor memory; the frameworks
        apply each count to a slice's first layers)."""
        idx = [i for i in self.plan.layers(v) if self.inst.layers[i].kind not in NOT_DECODER]
        by_layer: dict = {}
        for i in idx:
            by_layer.setdefault(repr(self.inst.layers[i]), []).append(self.plan.recompute[i])
        for modes in by_layer.values():
            modes.sort(key=lambda m: -DEPTH[m])
        return [by_layer[repr(self.inst.layers[i])].pop(0) for i in idx]

    def decoder_layers(self) -> tuple[int, ...]:
        """Decoder layers of every virtual stage, in model order."""
        return tuple(len(self._modes(v)) for v in range(self.inst.pipeline.chunks))

    def mode_counts(self, mode: str) -> tuple[int, ...]:
        """Decoder layers of every virtual stage at recompute ``mode``; a one-line error when a slice's
        modes are not in the order the frameworks apply counts (``prefix_ordered``)."""
        for v in range(self.inst.pipeline.chunks):
            if not prefix_ordered(self._modes(v)):
                raise NdplanError("recompute", self._modes(v), f"virtual stage {v} recomputes layers that are not "
                                  "its first ones (its decoder layers are of several kinds); MindFormers and "
                                  "Megatron-LM recompute a slice's first N layers", "balance a layer file whose "
                                  "decoder layers are of one kind, or set the lists by hand")
        return tuple(self._modes(v).count(mode) for v in range(self.inst.pipeline.chunks))

    def has_comm(self) -> bool:
        return any(any(self.mode_counts(m)) for m in COMM_MODES)

    def recompute_counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(full, selective) decoder-layer counts per virtual stage; the plan puts full
        recompute on a slice's first layers, then selective (ppb/model.py). A plan with
        MindSpore's communication recompute has no such form (a one-line error): only
        MindFormers names it (``mindformers.plan_fields`` reads ``mode_counts``)."""
        full, sel = self.mode_counts("full"), self.mode_counts("selective")
        if self.has_comm():
            raise NdplanError("recompute", "comm", "MindSpore's communication recompute (select_comm_recompute) "
                              "has no flag in this framework", "balance a layer file without the comm modes, or "
                              "take the MindFormers form")
        return full, sel

    def layout_groups(self) -> list[str]:
        """Megatron-LM layout group of every virtual stage from the layers' kinds. Megatron
        requires the embedding first and the loss last (``validate_layer_layout``): a
        layer file without them gets E on the first slice and L on the last, where
        Megatron-LM builds them."""
        layers = self.inst.layers
        groups = ["".join(LAYOUT_SYMBOL.get(layers[i].kind, "t") for i in self.plan.layers(v))
                  for v in range(self.inst.pipeline.chunks)]
        if not groups[0].startswith("E"):
            groups[0] = "E" + groups[0]
        if not groups[-1].endswith("L"):
            groups[-1] += "L"
        return groups

    def mtp_layers(self) -> int:
        return sum(layer.kind == "mtp" for layer in self.inst.layers)


def plan_forms(inst: Instance, plan: Plan) -> dict:
    """{"mindformers": {offset, recompute, select_recompute} | {"error": ...},
    "megatron": {"args": [...], "notes": [...]} | {"error": ...}}: what ``ndplan balance``
    prints for a plan, by the exporters' own translators."""
    from ndplan.export import megatron, mindformers
    bal = Balance(inst, plan)
    out = {}
    for name, form in (("mindformers", mindformers.plan_fields), ("megatron", megatron.plan_args)):
        try:
            out[name] = form(inst.pipeline, bal)
        except NdplanError as e:
            out[name] = {"error": e.problem}
    return out
