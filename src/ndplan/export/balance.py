"""A PPB result (``ndplan balance``) as the exporters read it: decoder layers and
recompute modes per virtual stage. Only decoder layers count (ppb/forms.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.ppb.forms import NOT_DECODER
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan


@dataclass(frozen=True)
class Balance:
    inst: Instance
    plan: Plan

    def _modes(self, v: int) -> list[str]:
        return [self.plan.recompute[i] for i in self.plan.layers(v) if self.inst.layers[i].kind not in NOT_DECODER]

    def decoder_layers(self) -> tuple[int, ...]:
        """Decoder layers of every virtual stage, in model order."""
        return tuple(len(self._modes(v)) for v in range(self.inst.pipeline.chunks))

    def recompute_counts(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(full, selective) decoder-layer counts per virtual stage; the plan puts full
        recompute on a slice's first layers, then selective (ppb/model.py)."""
        v_all = range(self.inst.pipeline.chunks)
        return (tuple(self._modes(v).count("full") for v in v_all),
                tuple(self._modes(v).count("selective") for v in v_all))
