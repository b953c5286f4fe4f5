"""DeepSpeed config keys that change memory without changing the parallel degrees, read
into engine settings (engines.derive on the deepspeed profile): the optimizer type and
its states. Sources: DeepSpeed 0.19.8 (the release CI installs), paths relative to the
``deepspeed`` package.
"""

from __future__ import annotations

from ndplan import optimizers as O
from ndplan.errors import NdplanError

DS_OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "lamb": "lamb", "lion": "lion", "adagrad": "adagrad",
                 "muon": "muon", "muadam": "adam", "muadamw": "adamw"}
"""DeepSpeed's own optimizer names (runtime/config.py:52-66, lower-cased at :518-520) -> the
ndplan.optimizers entry of what runtime/engine.py:2486-2546 builds: FusedAdam (two moments),
torch Adagrad (``sum``), FusedLamb (two moments), FusedLion (``exp_avg``), mup's MuAdam/MuAdamW
(Adam's moments) and MuonWithAuxAdam, whose Muon half is every matrix whose name has neither
"embed" nor "lm_head" (deepspeed/__init__.py:357-372) and whose other half is Adam."""
TORCH_STATES = {"Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}
"""Other names are torch.optim classes (runtime/engine.py:2547-2549: getattr(torch.optim, name));
SGD (and mup's MuSGD) keeps a momentum buffer only with momentum > 0, torch's default 0."""


def optimizer_settings(flat: dict, notes: list) -> dict:
    """optimizer_bytes (and Muon's non_matrix_optimizer_bytes) of ``optimizer.type``; without
    an ``optimizer`` section the script passes its own (the Hugging Face Trainer's AdamW)."""
    name = flat.get("optimizer.type")
    if name is None:
        notes.append("no optimizer section: the script's own optimizer, counted as AdamW (the Hugging Face "
                     "Trainer's default)")
        return {}
    if not isinstance(name, str):
        raise NdplanError("optimizer.type", name, "not an optimizer name", 'give e.g. "AdamW"')
    low = name.lower()
    if low in DS_OPTIMIZERS:
        opt = O.states(DS_OPTIMIZERS[low])
    elif name in TORCH_STATES:
        opt = O.states(TORCH_STATES[name])
    elif name == "SGD" or low == "musgd":
        momentum = flat.get("optimizer.params.momentum", 0)
        if not isinstance(momentum, (int, float)) or isinstance(momentum, bool) or momentum != momentum:
            raise NdplanError("optimizer.params.momentum", momentum, "not a number", "give e.g. 0.9")
        opt = O.states("sgd_momentum" if momentum else "sgd")
    else:
        notes.append(f"optimizer.type {name}: its states are counted as Adam's two fp32 moments (not modelled)")
        return {}
    return O.engine_settings(opt)


def engine(flat: dict, notes: list) -> str:
    """The deepspeed engine with the settings above (settings equal to the profile's left out)."""
    from ndplan.engines import DEEPSPEED, derive
    settings = optimizer_settings(flat, notes)
    return derive("deepspeed", {k: v for k, v in settings.items() if getattr(DEEPSPEED, k) != v})
