"""``ndplan trace``: the real Hugging Face module, traced on the CPU, beside ndplan's Terms.

Needs the optional extra ``ndplan[trace]`` (torch, transformers). ``trace_config`` reads a
config (catalog name, YAML or HF ``config.json``), traces it at small sizes over many shapes
(``run.trace_model``), fits each site's stored bytes exactly (``fit``) and lines them up with
the closed-form activation Terms (``compare``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.errors import NdplanError

EXTRA = "pip install 'ndplan[trace]'"


def require() -> None:
    """One line naming the extra when torch or transformers is missing."""
    for mod in ("torch", "transformers"):
        try:
            __import__(mod)
        except ImportError:
            raise NdplanError("trace", mod, "is not installed (ndplan trace runs the real module on the CPU)",
                              EXTRA) from None


@dataclass
class TraceReport:
    name: str
    result: object  # run.TraceResult
    rows: list  # compare.Row
    values: dict  # size symbol -> the real model's value (plus b, s)


def read_config(name_or_path: str) -> tuple[str, dict]:
    from ndplan.catalog.files import read_mapping, resolve
    path = resolve("models", name_or_path, "model")
    cfg = read_mapping(path, "model")
    if not cfg.get("model_type"):
        raise NdplanError("model_type", None, f"missing in {path}", "give the HF config.json (it names model_type)")
    name = path.stem if path.name != "config.json" else path.parent.name
    return name, cfg


def trace_config(name_or_path: str, policies=None, attn: str = "sdpa", mbs: int = 1, seq: int = 4096,
                 progress=None) -> TraceReport:
    require()
    from ndplan.trace import build, compare, run
    name, cfg = read_config(name_or_path)
    from dataclasses import fields

    from ndplan.catalog.model import model_from_config
    from ndplan.symbols import ModelSymbols
    spec = model_from_config(cfg, name, name)  # the field checks every command makes, before any tracing
    result = run.trace_model(cfg, policies=tuple(policies or build.POLICIES), attn=attn, progress=progress)
    M = ModelSymbols.of(spec)  # the real sizes, read as every other command reads them
    values = {f.name: int(getattr(M, f.name)) for f in fields(M)}
    if "ns" in result.names:  # DeepSeek: shared experts counted, each of the routed width
        values["ns"] = spec.shared_intermediate_size // max(spec.moe_intermediate_size, 1)
    values |= {"b": mbs, "s": seq}
    return TraceReport(name=name, result=result, rows=compare.rows(result, cfg), values=values)
