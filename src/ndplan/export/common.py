"""Shared pieces of the framework exporters: layers and recompute counts per virtual
stage, the one-line "cannot express" error, and the header every form carries.

Virtual stage v (0 .. pp*vpp-1) is the v-th model slice in layer order; it runs on
(stage, chunk) given by ``layouts.virtual_stage`` (interleaved: v = chunk*pp
+ stage; zbv: the V). Counts are decoder layers only (embedding and head are not
counted), as in ``Strategy.layers_per_stage`` and the frameworks' flags.
"""

from __future__ import annotations

from ndplan.catalog.model import ModelSpec
from ndplan.errors import NdplanError
from ndplan.labels import label
from ndplan.layouts import virtual_stage
from ndplan.ppb.plan import slot  # reads pp, vpp, schedule: a Strategy has them too
from ndplan.strategy import Strategy


def layers_per_chunk(model: ModelSpec, strat: Strategy, balance=None) -> tuple[int, ...]:
    """Decoder layers of every virtual stage, in model order."""
    if balance is not None:
        return balance.decoder_layers()
    if strat.layers_per_stage is not None:
        return tuple(strat.layers_per_stage)
    from ndplan import rules
    rules.check(rules.WithModel(strat, model), ("model",))  # the even-split rule among them: one source
    chunks = strat.pp * strat.vpp
    return (model.num_hidden_layers // chunks,) * chunks


def recompute_counts(model: ModelSpec, strat: Strategy, balance=None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(fully, selectively) recomputed decoder layers of every virtual stage.

    From the PPB plan when given; else ``strat.recompute`` on the first
    ``recompute_layers`` layers of each chunk (one count, or one per stage; an engine
    with ``recompute_count_per_stage`` deals a stage's count over its chunks,
    ``memory.chunk_recompute_count``), all layers when it is None.
    """
    if balance is not None:
        return balance.recompute_counts()
    from ndplan.engines import profile
    from ndplan.formulas.memory import chunk_recompute_count
    from ndplan import symbols as S
    eng = profile(strat.engine)
    layers = layers_per_chunk(model, strat)
    counts = []
    for v, n in enumerate(layers):
        rl = strat.recompute_layers
        if rl is None:
            k = n
        else:
            stage, chunk = slot(strat, v)
            nrec = rl[stage] if isinstance(rl, tuple) else rl
            k = min(n, int(chunk_recompute_count(eng, strat, chunk).subs(S.nrec, nrec)))
        counts.append(0 if strat.recompute == "none" else k)
    zero = (0,) * len(layers)
    if strat.recompute == "full":
        return tuple(counts), zero
    return zero, tuple(counts)


def recompute_mode(full, selective) -> str:
    """The one mode a framework that takes a single switch should get: the deepest used."""
    return "full" if max(full) else "selective" if max(selective) else "none"


def per_stage(strat: Strategy, values) -> list:
    """Values per virtual stage -> [stage] (vpp = 1) or [chunk][stage] (vpp > 1)."""
    rows = [[values[virtual_stage(strat.schedule, s, c, strat.pp)] for s in range(strat.pp)]
            for c in range(strat.vpp)]
    return rows[0] if strat.vpp == 1 else rows


def cannot(target: str, field: str, value, fix: str) -> NdplanError:
    """The error for a strategy the target cannot express."""
    return NdplanError(field, value, f"{target} cannot express this; {fix}")


def refuse_engine_rules(target: str, c, fields=None) -> None:
    """Raise, as ``target``'s refusal, the first of rules.py's engine rules (on ``fields`` only,
    if given) that ``c`` fails: what that framework would refuse or not run. ``c``: a context
    with the engine that runs it (rules.WithModel(strategy, model, engine=...)), or, with
    ``fields``, anything with the attributes those rules read."""
    from ndplan import rules
    rule = rules.first_failure(c, rules.ENGINE_SCOPES, fields)
    if rule is not None:
        raise cannot(target, rules.field_of(rule, c), rule.value(c), f"{rule.problem(c)}; {rule.fix(c)}")


HEADER_PHRASE = "form of an ndplan strategy for"
"""The first header line of every emitted file ends in this phrase and the model's name
(interop.emitted_model reads the model back from it)."""


def header(target: str, model: ModelSpec, strat: Strategy, prefix: str = "# ") -> list[str]:
    return [f"{prefix}{target} {HEADER_PHRASE} {model.name}", prefix + label(strat, full=True)]


def nest(flat: dict) -> dict:
    """Dotted keys (``zero_optimization.stage``) -> nested mappings, order kept."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return out


def flatten(doc: dict, prefix: str = "") -> dict:
    """Nested mappings -> dotted keys (the inverse of ``nest`` for mapping leaves)."""
    out = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flatten(v, key + ".")
        else:
            out[key] = v
    return out
