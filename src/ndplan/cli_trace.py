"""``ndplan trace CONFIG``: thin command over ndplan.trace."""

from __future__ import annotations

import json
import sys

import click

from ndplan.cli_types import BATCH, SEQ
from ndplan.units import fmt_bytes

ATTN_NOTE = {"sdpa": "sdpa (transformers' default; the flash path saves the output and the fp32 log-sum-exp, "
                     "as FlashAttention-2 does)",
             "eager": "eager (saves the fp32 softmax and its bf16 copy, s x s per head)"}


def _number(expr, values) -> int:
    from ndplan.trace.run import evaluate
    return evaluate(expr, values)


def report_doc(rep) -> dict:
    r = rep.result
    rows = []
    for row in rep.rows:
        traced = _number(row.traced, rep.values)
        closed = None if row.closed is None else _number(row.closed, rep.values)
        rows.append({"site": row.site, "policy": row.policy, "traced_bytes": traced, "closed_form_bytes": closed,
                     "difference_pct": None if closed is None else round(100 * (closed - traced) / max(traced, 1), 3),
                     "traced_formula": str(row.traced), "closed_form": None if row.closed is None else str(row.closed),
                     "difference_formula": None if row.closed is None else str(row.difference),
                     "exact_fit": row.exact})
    return {"model": rep.name, "model_type": r.model_type, "attn_implementation": r.attn,
            "micro_batch": rep.values["b"], "seq": rep.values["s"], "shapes_traced": r.shapes,
            "shapes_held_out": r.held_out, "versions": r.versions, "engine": "hf",
            "sizes": {k: v for k, v in rep.values.items() if k not in ("b", "s")},
            "note": "bytes per micro-batch on one device (tp = cp = 1), what each site keeps for backward",
            "caveats": _caveats(rep), "rows": rows}


def _caveats(rep) -> list[str]:
    """What the CPU trace cannot show for this config, in words."""
    out = []
    names = set(rep.result.names)
    pols = {row.policy for row in rep.rows}
    if "kl" in names and rep.result.attn == "sdpa" and "none" in pols:
        out.append("MLA: q and v head dims differ, so sdpa on the CPU falls back to the math kernel and saves the "
                   "s x s probabilities that GPU kernels (efficient, cuDNN) do not; policy none overstates the layer")
    out.append("traced on transformers modules, not torchtitan's: its language models attend with FlexAttention, "
               "which has no backward on the CPU (torch 2.13); torchtitan's own modules run on the gloo harness "
               "instead (ndplan.trace.titan, with torchtitan's sdpa module)")
    if "op" in pols:
        out.append("op (torchtitan op-level SAC) is compared with the closed form the fsdp engine's selective "
                   "recompute uses (formulas/activations.op_sac_layer), evaluated with the hf profile")
    if any(not row.exact for row in rep.rows):
        out.append("a row marked 'fit not exact' keeps tensors whose sizes depend on the routing or on the shape "
                   "in a way the polynomial basis does not hold; its bytes are a least-squares estimate")
    return out


def report_text(doc: dict) -> str:
    lines = [f"{doc['model']} ({doc['model_type']}): transformers {doc['versions']['transformers']} modules, "
             f"torch {doc['versions']['torch']} on the CPU, micro-batch {doc['micro_batch']} x seq {doc['seq']}",
             f"  attention: {ATTN_NOTE[doc['attn_implementation']]}",
             f"  {doc['shapes_traced']} small shapes traced, exact polynomial checked at {doc['shapes_held_out']} "
             f"held out; {doc['note']}",
             "",
             f"{'site':<10} {'policy':<10} {'traced':>12} {'ndplan (hf)':>12} {'diff':>8}"]
    for r in doc["rows"]:
        closed = "-" if r["closed_form_bytes"] is None else fmt_bytes(r["closed_form_bytes"])
        diff = "-" if r["difference_pct"] is None else f"{r['difference_pct']:+.2f}%"
        flag = "" if r["exact_fit"] else "  (fit not exact)"
        lines.append(f"{r['site']:<10} {r['policy']:<10} {fmt_bytes(r['traced_bytes']):>12} {closed:>12} {diff:>8}{flag}")
    lines += [f"note: {c}" for c in doc["caveats"]]
    lines.append("")
    lines.append("traced formulas (b micro-batch, s sequence; bytes):")
    for r in doc["rows"]:
        extra = "" if not r["difference_formula"] or r["difference_formula"] == "0" else \
            f"   [traced - ndplan = {r['difference_formula']}]"
        lines.append(f"  {r['site']}/{r['policy']}: {r['traced_formula']}{extra}")
    return "\n".join(lines)


def register(main):
    from ndplan.trace.build import ATTN, COMPILED, POLICIES

    @main.command("trace")
    @click.argument("config")
    @click.option("--policy", "policies", multiple=True, type=click.Choice(POLICIES + (COMPILED,)),
                  help="Recompute policy to trace (repeat; default: all but compiled). none; selective = "
                       "Megatron's core-attention recompute; op = torchtitan's op-level SAC save list; full = every "
                       "layer checkpointed; compiled = no recompute, every decoder layer under torch.compile "
                       "(compared with the engine setting compiled_blocks).")
    @click.option("--attn", type=click.Choice(ATTN), default="sdpa", show_default=True,
                  help="attn_implementation of the transformers modules.")
    @click.option("--mbs", type=BATCH, default=1, show_default=True, help="Micro-batch the bytes are printed at.")
    @click.option("--seq", type=SEQ, default=4096, show_default=True, help="Sequence length the bytes are printed at.")
    @click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    def trace_cmd(config, policies, attn, mbs, seq, as_json):
        """Trace the real Hugging Face module of CONFIG (catalog name, model YAML or
        config.json) on the CPU and print, per site (embedding, dense layer, MoE layer,
        head + loss) and recompute policy, the bytes it keeps for backward beside
        ndplan's closed-form Terms (engine hf) and the difference.

        The module is built by transformers from the config at small sizes (random
        weights, nothing downloaded), one forward + backward per shape in bf16; a
        TorchDispatchMode counts every tensor storage until it is freed. The bytes are
        fitted exactly as a polynomial in micro-batch, sequence and the model's sizes,
        then evaluated at the real sizes. --policy compiled compiles every decoder layer
        (inductor's partitioner decides what it saves) and counts the saved tensors with
        saved-tensor hooks, about 1 s per shape. Needs the extra: pip install 'ndplan[trace]'.

        \b
        Examples:
          ndplan trace llama3-8b --policy none
          ndplan trace qwen2.5-7b --attn eager --policy full --seq 2048 --json
          ndplan trace llama3-8b --policy compiled
        """
        from ndplan.trace import trace_config
        progress = None if as_json else (lambda j, n: click.echo(f"\rtracing shape {j}/{n}", nl=j == n, err=True))
        rep = trace_config(config, policies=policies or None, attn=attn, mbs=mbs, seq=seq, progress=progress)
        doc = report_doc(rep)
        click.echo(json.dumps(doc, indent=2) if as_json else report_text(doc))
        sys.stdout.flush()
