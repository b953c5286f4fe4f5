"""Read a PyTorch DeviceMesh module (the ``--emit devicemesh`` form, export/devicemesh.py)
for ``ndplan check``, without running it (``ast``; literals only).

What the module executes is read from its code: the mesh (``MESH_SHAPE`` and
``MESH_DIM_NAMES``: pp, dp = dp_replicate x dp_shard, cp, tp; the world is their product),
the pipeline split (``LAYERS_PER_VIRTUAL_STAGE``: pp x vpp chunks in model order), the
batch (``MICRO_BATCH_SIZE``, ``MICRO_BATCHES``; gbs = mbs x m x dp), ``SEQ_LEN``, and the
ZeRO stage from FSDP2's ``fully_shard(..., reshard_after_forward=...)`` (True: 3; False: 2,
or 1 when the label says 1, since FSDP2 has no optimizer-only sharding and runs both
alike; no ``fully_shard``: 0, DDP). What the module leaves to the user's model code
(``parallelize`` comments: EP and expert TP, recompute, the pipeline schedule, SP, the
engine) is read from the strategy label of its docstring, said in a note.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from ndplan.errors import NdplanError
from ndplan.export import devicemesh as X
from ndplan.export.common import HEADER_PHRASE
from ndplan.interop.base import CheckInput, positive, resolve_model

CONSTANTS = ("MESH_SHAPE", "MESH_DIM_NAMES", "LAYERS_PER_VIRTUAL_STAGE", "MICRO_BATCH_SIZE", "MICRO_BATCHES",
             "SEQ_LEN")
MESH_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FROM_LABEL = ("ep", "etp", "recompute", "schedule", "sp", "engine")
"""Strategy fields the module does not execute (its ``parallelize`` leaves them to the model code)."""


def detect(text: str) -> bool:
    return "init_device_mesh" in text and "MESH_SHAPE" in text


def _tree(path: Path, text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as e:
        raise NdplanError("FILE", path.name, f"not valid Python (line {e.lineno}: {e.msg})",
                          "give the module `ndplan ... --emit devicemesh` wrote") from None


def _constants(path: Path, text: str, tree: ast.Module) -> dict[str, tuple[object, int]]:
    """CONSTANTS assigned at module level: name -> (literal value, 1-based line)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in CONSTANTS:
            name = node.targets[0].id
            try:
                out[name] = (ast.literal_eval(node.value), node.lineno)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                raise NdplanError(name, ast.get_source_segment(text, node.value),
                                  f"not a literal (line {node.lineno} of {path.name})",
                                  "write the value itself, as --emit devicemesh does") from None
    missing = [c for c in CONSTANTS if c not in out]
    if missing:
        raise NdplanError(missing[0], None, f"not assigned in {path.name}",
                          f"give the module --emit devicemesh writes (it assigns {', '.join(CONSTANTS)})")
    return out


def _reshard(tree: ast.Module) -> bool | None:
    """``reshard_after_forward`` of the module's ``fully_shard`` calls (None: no such call)."""
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "fully_shard":
            for kw in node.keywords:
                if kw.arg == "reshard_after_forward":
                    if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool)):
                        raise NdplanError("reshard_after_forward", ast.unparse(kw.value),
                                          f"not True or False (line {node.lineno})",
                                          "write the value itself, as --emit devicemesh does")
                    found = kw.value.value
            found = True if found is None else found  # FSDP2's default is True
    return found


def _label(doc: str) -> dict[str, str]:
    """``field=value`` items of the docstring's strategy line (labels.label, full form)."""
    line = next((ln for ln in doc.splitlines() if ln.startswith("dp=")), "")
    items = re.findall(r"(\w+)=((?:[^\s\[]|\[[^\]]*\])+)", line)  # recompute=full[first 4] is one item
    return dict(items)


def _label_int(lab: dict, key: str) -> int:
    """An integer field of the docstring's strategy line (1 when absent)."""
    v = lab.get(key, "1")
    if not v.isdigit() or int(v) < 1:
        raise NdplanError(key, v, "not a positive whole number in the docstring's strategy line",
                          "write it as --emit devicemesh does, e.g. ep=1")
    return int(v)


def _label_sp(lab: dict) -> bool:
    v = lab.get("sp", "on")
    if v not in ("on", "off"):
        raise NdplanError("sp", v, "not on or off in the docstring's strategy line", "write sp=on or sp=off")
    return v == "on"


def _recompute(text: str) -> tuple[str, object]:
    """(mode, recompute_layers) of ``selective`` or ``full[first 4]`` / ``[first 4,2]`` (labels.recompute_text)."""
    m = re.fullmatch(r"(\w+)(?:\[first ([\d,]+)\])?", text)
    if not m:
        raise NdplanError("recompute", text, "not a recompute label", "give none, selective or full")
    counts = m.group(2)
    if counts is None:
        return m.group(1), None
    parts = tuple(int(c) for c in counts.split(","))
    return m.group(1), parts[0] if len(parts) == 1 else parts


def _int(name: str, value, path: Path) -> int:
    return positive(name, value, path.name)


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    from ndplan.catalog.files import catalog_names
    from ndplan.catalog.model import load_model
    from ndplan.strategy import Strategy
    tree = _tree(path, text)
    c = _constants(path, text, tree)
    names, shape = (tuple(v) if isinstance(v, list) else v  # init_device_mesh takes lists too
                    for v in (c["MESH_DIM_NAMES"][0], c["MESH_SHAPE"][0]))
    if not isinstance(shape, tuple):
        raise NdplanError("MESH_SHAPE", shape, "not a tuple of sizes", "give the mesh --emit devicemesh writes")
    if not (isinstance(names, tuple) and len(names) == len(shape)
            and all(isinstance(n, str) for n in names) and set(names) <= set(MESH_NAMES)
            and len(set(names)) == len(names)):
        raise NdplanError("MESH_DIM_NAMES", names, f"with MESH_SHAPE {shape}: not one size per distinct dim of "
                          f"{', '.join(MESH_NAMES)}", "give the mesh --emit devicemesh writes")
    size = {n: _int(f"MESH_SHAPE[{n}]", v, path) for n, v in zip(names, shape)}
    size = {n: size.get(n, 1) for n in MESH_NAMES}
    if size["dp_replicate"] > 1 and size["dp_shard"] > 1:
        raise NdplanError("MESH_SHAPE", shape, "dp_replicate and dp_shard both above 1 (HSDP) is not modelled",
                          "give all data parallelism to one of them")
    doc = ast.get_docstring(tree) or ""
    lab = _label(doc)
    named = re.search(re.escape(HEADER_PHRASE) + r" (\S+?)\.?$", doc.splitlines()[0] if doc else "")
    file_model = load_model(named.group(1)) if named and named.group(1) in catalog_names("models") else None
    spec, origin = resolve_model(model, file_model, f"{named.group(1) if named else ''}, named in the docstring",
                                 f"{path.name} names no catalog model")
    world = 1
    for v in size.values():
        world *= v
    if gpus is not None and gpus != world:
        raise NdplanError("gpus", gpus, f"{path.name} builds a mesh of {world} devices", "drop --gpus or change MESH_SHAPE")
    dp, pp = size["dp_replicate"] * size["dp_shard"], size["pp"]
    chunks = c["LAYERS_PER_VIRTUAL_STAGE"][0]
    if not isinstance(chunks, list) or not chunks or len(chunks) % pp:
        raise NdplanError("LAYERS_PER_VIRTUAL_STAGE", chunks, f"not a list of pp*vpp counts (pp={pp})",
                          "give one decoder-layer count per virtual stage, in model order")
    chunks = tuple(_int("LAYERS_PER_VIRTUAL_STAGE", n, path) for n in chunks)
    vpp = len(chunks) // pp
    even = len(set(chunks)) == 1 and chunks[0] * len(chunks) == spec.num_hidden_layers
    mbs, m = _int("MICRO_BATCH_SIZE", c["MICRO_BATCH_SIZE"][0], path), _int("MICRO_BATCHES", c["MICRO_BATCHES"][0], path)
    reshard = _reshard(tree)
    label_zero = lab.get("zero")
    zero = 0 if reshard is None else (3 if reshard else (1 if label_zero == "1" else 2))
    rec, rec_layers = _recompute(lab.get("recompute", "none"))
    kw = dict(dp=dp, tp=size["tp"], pp=pp, cp=size["cp"], vpp=vpp, mbs=mbs,
              gbs=gbs if gbs is not None else mbs * m * dp, seq=seq if seq is not None else _int("SEQ_LEN", c["SEQ_LEN"][0], path),
              zero=zero, ep=_label_int(lab, "ep"), etp=_label_int(lab, "etp"), recompute=rec,
              recompute_layers=rec_layers, sp=_label_sp(lab), engine=lab.get("engine", "fsdp"),
              layers_per_stage=None if even else chunks)
    if "schedule" in lab:
        kw["schedule"] = lab["schedule"]
    strat = Strategy(**kw)
    strat.check(spec, world)
    line = {k: v[1] for k, v in c.items()}
    org = {f: f"line {line['MESH_SHAPE']}: MESH_SHAPE {f}" for f in ("tp", "pp", "cp")}
    org |= {"dp": f"line {line['MESH_SHAPE']}: MESH_SHAPE dp_replicate x dp_shard", "gpus": "the mesh's size",
            "vpp": f"line {line['LAYERS_PER_VIRTUAL_STAGE']}: LAYERS_PER_VIRTUAL_STAGE / pp",
            "mbs": f"line {line['MICRO_BATCH_SIZE']}: MICRO_BATCH_SIZE", "gbs": "mbs x MICRO_BATCHES x dp",
            "seq": f"line {line['SEQ_LEN']}: SEQ_LEN" if seq is None else "--seq",
            "zero": "fully_shard reshard_after_forward" if reshard is not None else "no fully_shard: DDP"}
    org |= {f: "the docstring's label" for f in FROM_LABEL if f in lab}
    if gbs is not None:
        org["gbs"] = "--gbs"
    notes = [f"{', '.join(f for f in FROM_LABEL if f in lab)}: from the docstring's strategy line; the module leaves "
             "them to your model code (parallelize)"]
    if reshard is False and label_zero == "1":
        notes.append("zero 1: FSDP2 has no optimizer-only sharding; the code runs reshard_after_forward=False, "
                     "as for zero 2")
    return CheckInput(path=path, fmt="devicemesh", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=world, origin=org, lines={k: v for k, v in line.items()}, notes=tuple(notes))


def rewrite(ci: CheckInput, strat) -> str:
    """A proposal as the module --emit devicemesh writes for it (``check``'s diff is against it)."""
    return X.emit(ci.model, strat)


def edit(text: str, changes: dict) -> str:
    raise NdplanError("--format", "devicemesh", "editing a DeviceMesh module is not supported",
                      "emit the proposal with --emit devicemesh")
