"""Framework forms of a plan: MindFormers ``offset`` / ``recompute`` /
``select_recompute`` and Megatron-LM layout and recompute flags.

Only decoder layers count (kinds other than embedding, head and mtp). In every slice the
plan puts full recompute on its first decoder layers, then selective, then none (model.py),
which is the frameworks' "first N layers of the chunk" rule.

* MindFormers (``parallel_config`` + ``recompute_config``): with vpp = 1 each list has
  one entry per stage; with vpp > 1 one list per chunk, each with one entry per stage.
  ``offset`` = decoder layers of the slice - L // (pp*vpp); ``recompute`` = fully
  recomputed layers; ``select_recompute`` = selectively recomputed layers + fully
  recomputed ones (a full recompute also drops what selective would; the convention of
  MindSpore SAPP's yaml output).
* Megatron-LM: ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  when vpp = 1 and only the first and last stages differ from an even middle; otherwise
  ``--pipeline-model-parallel-layout`` with one ``|``-separated group per virtual stage
  (E embedding, t decoder layer, m MTP layer, L loss/head). Megatron applies one
  ``--recompute-num-layers`` to every chunk, so a plan whose per-chunk counts differ is
  given with the largest count and a note.
"""

from __future__ import annotations

from ndplan.formulas.schedules import virtual_stage
from ndplan.ppb.instance import Instance
from ndplan.ppb.plan import Plan

NOT_DECODER = ("embedding", "head", "mtp")


def _decoder(inst: Instance, plan: Plan, v: int) -> list[str]:
    """Recompute modes of slice v's decoder layers."""
    return [plan.recompute[i] for i in plan.layers(v) if inst.layers[i].kind not in NOT_DECODER]


def mindformers(inst: Instance, plan: Plan) -> dict:
    p = inst.pipeline
    n_dec = sum(len(_decoder(inst, plan, v)) for v in range(p.chunks))
    base = n_dec // p.chunks
    out = {"offset": [], "recompute": [], "select_recompute": []}
    for c in range(p.vpp):
        row = {k: [] for k in out}
        for s in range(p.pp):
            modes = _decoder(inst, plan, virtual_stage(p.schedule, s, c, p.pp))
            row["offset"].append(len(modes) - base)
            row["recompute"].append(modes.count("full"))
            row["select_recompute"].append(modes.count("full") + modes.count("selective"))
        for k in out:
            out[k].append(row[k])
    if p.vpp == 1:
        out = {k: v[0] for k, v in out.items()}
    return out


def megatron(inst: Instance, plan: Plan) -> dict:
    """{"args": [...], "notes": [...]}: command-line flags for Megatron-LM."""
    p = inst.pipeline
    counts = [len(_decoder(inst, plan, v)) for v in range(p.chunks)]
    args, notes = [], []
    middle = counts[1:-1]
    if p.vpp == 1 and p.pp > 2 and len(set(middle)) == 1 and (counts[0], counts[-1]) != (middle[0], middle[0]):
        args += [f"--decoder-first-pipeline-num-layers {counts[0]}", f"--decoder-last-pipeline-num-layers {counts[-1]}"]
    elif len(set(counts)) > 1:
        symbol = {"embedding": "E", "head": "L", "mtp": "m"}
        groups = ["".join(symbol.get(inst.layers[i].kind, "t") for i in plan.layers(v)) for v in range(p.chunks)]
        args.append(f"--pipeline-model-parallel-layout \"{'|'.join(groups)}\"")
    if p.vpp > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank {p.vpp}")
    full = [_decoder(inst, plan, v).count("full") for v in range(p.chunks)]
    sel = [_decoder(inst, plan, v).count("selective") for v in range(p.chunks)]
    if max(full):
        args += ["--recompute-granularity full", "--recompute-method block", f"--recompute-num-layers {max(full)}"]
        if len(set(full)) > 1:
            notes.append(f"the plan recomputes {full} layers per chunk; Megatron-LM takes one count for all "
                         f"chunks, {max(full)} given (uses more memory headroom, costs more time)")
        if max(sel):
            notes.append("Megatron-LM runs one recompute granularity: selective layers of this plan are not expressed")
    elif max(sel):
        args.append("--recompute-granularity selective")
        if min(sel) < min(len(_decoder(inst, plan, v)) for v in range(p.chunks)):
            notes.append(f"the plan recomputes {sel} layers per chunk selectively; Megatron-LM's selective "
                         "recompute covers every layer")
    return {"args": args, "notes": notes}
