"""A plan given by the user to replay and compare (``ndplan balance --plan``), in one of the forms
the frameworks and SAPP write:

* slice sizes, ``21,20,20,21``: layers per virtual stage in model order (the layer file's layers,
  embedding and head included), with ``--plan-recompute`` one mode for every layer or one mode per
  layer (comma-separated);
* a Megatron-LM layout, ``Et*3|t*4|t*4|t*3L`` (``--pipeline-model-parallel-layout``: E embedding,
  t decoder layer, m MTP layer, L loss, ``|`` between virtual stages, ``x*N`` N times;
  megatron/core/transformer/pipeline_parallel_layer_layout.py ``parse_str_to_list``);
* a MindFormers YAML or JSON file (``--plan FILE``): ``offset`` and the ``recompute``,
  ``select_recompute`` and ``select_comm_recompute`` counts, at the top level or where MindFormers
  keeps them (``model.model_config.offset``, ``recompute_config.*``): a slice holds
  L // (pp * vpp) + offset decoder layers, and its first ``recompute`` layers are fully recomputed,
  its first ``select_recompute`` selectively and its first ``select_comm_recompute`` recompute the
  communication (a fully recomputed layer counts in all three), which SAPP reads back as full,
  selective+comm = min of the two select counts beyond full, then selective or comm alone
  (toolkit/pipeline_balance/utils/recompute.py ``internal_from_yaml`` at v1.6.0-beta1). A count
  is a bool (True: every layer), one per stage, or with vpp > 1 one list per chunk (a value of
  True in a list: every layer of that slice); negative counts are refused, and so is a flat list
  with vpp > 1 (MindFormers deals it over the chunks: give the per-chunk lists it runs).
"""

from __future__ import annotations

import re
from pathlib import Path

from ndplan.catalog.files import read_mapping
from ndplan.errors import NdplanError
from ndplan.formulas.schedules import virtual_stage
from ndplan.vocab import BIDIRECTIONAL_SCHEDULES
from ndplan.ppb.instance import MODES, Instance
from ndplan.export.balance import LAYOUT_SYMBOL, NOT_DECODER
from ndplan.ppb.plan import Plan

MF_KEYS = ("offset", "recompute", "select_recompute", "select_comm_recompute")


def user_plan(inst: Instance, text: str | None, recompute: str | None) -> Plan | None:
    """The plan ``--plan`` / ``--plan-recompute`` describe (module docstring), checked against the
    instance; None without ``--plan``."""
    if text is None:
        if recompute is not None:
            raise NdplanError("--plan-recompute", recompute, "given without --plan", "give --plan too, or drop it")
        return None
    if re.fullmatch(r"[\d,\s]+", text) or ("," in text and not Path(text).exists()):
        plan = _from_sizes(inst, text, recompute)
    elif "|" in text or re.fullmatch(r"[EtmL*\d\s]+", text):
        plan = _with_modes(inst, _layout_bounds(inst, text), recompute)
    else:
        if recompute is not None:
            raise NdplanError("--plan-recompute", recompute, "given with a MindFormers plan file, whose recompute "
                              "lists say the modes", "drop --plan-recompute")
        plan = _from_mindformers(inst, read_mapping(Path(text), "--plan"))
    plan.check(inst)
    return plan


def _bounds(sizes: list[int]) -> tuple[int, ...]:
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return tuple(out)


def _from_sizes(inst: Instance, text: str, recompute: str | None) -> Plan:
    parts = text.replace(" ", "").split(",")
    if not all(x.isdigit() for x in parts):
        raise NdplanError("--plan", text, "not comma-separated layer counts", "give layers per virtual stage, "
                          "e.g. 21,20,20,21")
    sizes = [int(x) for x in parts]
    if len(sizes) != inst.pipeline.chunks or sum(sizes) != len(inst.layers) or min(sizes) < 1:
        raise NdplanError("--plan", text, f"{len(sizes)} counts summing to {sum(sizes)}",
                          f"give {inst.pipeline.chunks} positive counts summing to {len(inst.layers)} "
                          "(the layer file's layers, embedding and head included)")
    return _with_modes(inst, _bounds(sizes), recompute)


def _with_modes(inst: Instance, bounds: tuple[int, ...], recompute: str | None) -> Plan:
    """``bounds`` with one mode for every layer (as far as each offers it, Layer.at_most) or one per layer."""
    modes = (recompute or "none").replace(" ", "").split(",")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise NdplanError("--plan-recompute", bad[0], "not a recompute mode", f"one of {', '.join(MODES)}")
    if len(modes) == 1:
        return Plan(bounds=bounds, recompute=tuple(layer.at_most(modes[0]) for layer in inst.layers))
    if len(modes) != len(inst.layers):
        raise NdplanError("--plan-recompute", len(modes), f"modes for {len(inst.layers)} layers",
                          "give one mode, or one per layer of the layer file")
    return Plan(bounds=bounds, recompute=tuple(modes))


def _layout_bounds(inst: Instance, text: str) -> tuple[int, ...]:
    """Slice bounds of a Megatron-LM layout: each group's letters matched, in order, against the
    layer file's layers (E the embedding, L the head, m MTP layers, t any other)."""
    groups = [_expand_group(g, text) for g in text.replace(" ", "").split("|")]
    if len(groups) != inst.pipeline.chunks:
        raise NdplanError("--plan", text, f"{len(groups)} layout groups", f"give {inst.pipeline.chunks} groups "
                          "separated by | (pp x vpp virtual stages)")
    letters = [LAYOUT_SYMBOL.get(layer.kind, "t") for layer in inst.layers]
    flat = "".join(groups)
    have_e, have_l = letters[0] == "E", letters[-1] == "L"
    expect = "".join(x for x in letters)
    given = flat if have_e else flat.lstrip("E")
    given = given if have_l else given.rstrip("L")
    if given != expect:
        raise NdplanError("--plan", text, f"lays out {given.count('t')} decoder layers ({given})"
                          f" where the layer file has {expect.count('t')} ({expect[:12]}...)",
                          "give a layout of the layer file's layers")
    sizes = [len(g) - (g.startswith("E") and not have_e) - (g.endswith("L") and not have_l) for g in groups]
    if min(sizes) < 1:
        raise NdplanError("--plan", text, "an empty virtual stage", "give every stage at least one layer")
    return _bounds(sizes)


def _expand_group(group: str, text: str) -> str:
    out = ""
    for letter, times in re.findall(r"([EtmL])(?:\*(\d+))?", group):
        out += letter * int(times or 1)
    if re.sub(r"[EtmL](\*\d+)?", "", group):
        raise NdplanError("--plan", text, f"'{group}' is not a layout group", "write letters E, t, m, L with *N")
    return out


def _mf_value(doc: dict, key: str):
    for path in ((key,), ("model", "model_config", key), ("recompute_config", key)):
        d = doc
        for part in path:
            d = d.get(part) if isinstance(d, dict) else None
        if d is not None:
            return d
    return None


def _per_slice(inst: Instance, value, key: str, layers_of) -> list[int]:
    """A MindFormers count (bool, int, [stage], [[stage] per chunk]) as a count per virtual stage."""
    p = inst.pipeline
    if value is None or (value is False and key != "offset") or (value == 0 and not isinstance(value, bool)):
        return [0] * p.chunks
    if value is True and key != "offset":
        return [layers_of[v] for v in range(p.chunks)]
    rows = value if p.vpp > 1 else [value]
    shape = f"{p.vpp} lists (one per chunk) of {p.pp}" if p.vpp > 1 else f"a list of {p.pp}"
    if (not isinstance(rows, list) or len(rows) != p.vpp
            or any(not isinstance(r, list) or len(r) != p.pp for r in rows)
            or any(not isinstance(x, int) or (isinstance(x, bool) and key == "offset") for r in rows for x in r)):
        raise NdplanError(key, value, "not one whole number per stage (and chunk)", f"give {shape} integers")
    out = [0] * p.chunks
    for c, row in enumerate(rows):
        for s, x in enumerate(row):
            v = virtual_stage(p.schedule, s, c, p.pp)
            if key != "offset" and not isinstance(x, bool) and x < 0:
                raise NdplanError(key, value, "a negative layer count", "give counts of 0 or more")
            out[v] = layers_of[v] if x is True else int(x)  # True: every layer of the slice (MindFormers)
    return out


def _from_mindformers(inst: Instance, doc: dict) -> Plan:
    p = inst.pipeline
    if p.schedule in BIDIRECTIONAL_SCHEDULES:  # each slice on two stages: MindFormers has no such layout
        raise NdplanError("--plan", "file", "a MindFormers plan under dualpipe (MindFormers runs no DualPipe)",
                          f"give {p.chunks} slice sizes or a Megatron-LM layout string")
    if not any(_mf_value(doc, k) is not None for k in MF_KEYS):
        raise NdplanError("--plan", "file", f"names none of {', '.join(MF_KEYS)}",
                          "give a MindFormers offset and recompute lists (top level, or model.model_config.offset "
                          "and recompute_config)")
    decoder = [i for i, layer in enumerate(inst.layers) if layer.kind not in NOT_DECODER]
    base = len(decoder) // p.chunks
    offset = _mf_value(doc, "offset")
    offsets = _per_slice(inst, offset if offset not in (None, 0) else None, "offset", [0] * p.chunks)
    counts = [base + o for o in offsets]
    if sum(counts) != len(decoder) or min(counts) < 0:
        raise NdplanError("offset", offset, f"gives {sum(counts)} decoder layers ({counts})",
                          f"offsets summing to {len(decoder) - base * p.chunks} (the layer file has {len(decoder)} "
                          f"decoder layers on {p.chunks} virtual stages)")
    full, sel, comm = (_per_slice(inst, _mf_value(doc, k), k, counts) for k in MF_KEYS[1:])
    modes, starts = [], [0]
    for v in range(p.chunks):
        f = min(full[v], counts[v])
        both = max(min(sel[v] - f, comm[v] - f), 0)
        only = [("selective", max(sel[v] - f - both, 0)), ("comm", max(comm[v] - f - both, 0))]
        row = ["full"] * f + ["selective+comm"] * both + [m for m, n in only for _ in range(n)]
        modes += (row + ["none"] * counts[v])[:counts[v]]
        starts.append(starts[-1] + counts[v])
    rec = ["none"] * len(inst.layers)
    for i, m in zip(decoder, modes):
        rec[i] = inst.layers[i].at_most(m)
    # slice v + 1 starts at its first decoder layer (what precedes it, embedding included, stays behind)
    bounds = [0] + [decoder[starts[v + 1]] if starts[v + 1] < len(decoder) else len(inst.layers)
                    for v in range(p.chunks - 1)] + [len(inst.layers)]
    return Plan(bounds=tuple(bounds), recompute=tuple(rec))
