"""Optimizer state per parameter as a property of the optimizer: what each optimizer
keeps beside the (master) weights, in bytes per parameter, for the states' dtype.

The engine profiles assume Adam with fp32 moments (``optimizer_bytes`` = 8); a reader
that finds the recipe's optimizer sets the engine's ``optimizer_bytes`` (and, for
optimizers that treat the embedding and output layer apart, ``non_matrix_optimizer_bytes``)
from this table through ``engines.derive``. States take the dtype of the tensor they are
made from (``torch.zeros_like(p)`` of the fp32 master in Megatron, DeepSpeed and FSDP2;
MindSpore's ``clone`` of the 16-bit parameter unless the optimizer says fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

from ndplan.errors import NdplanError


@dataclass(frozen=True)
class OptimizerStates:
    name: str
    states: int
    """Tensors of the parameter's shape the optimizer keeps per parameter."""
    non_matrix_states: int | None = None
    """States of the embedding and output layer when the optimizer treats them apart
    (Muon updates them with AdamW), else None (the same as ``states``)."""
    source: str = ""

    def bytes_per_param(self, state_bytes: int = 4) -> int:
        return self.states * state_bytes

    def non_matrix_bytes(self, state_bytes: int = 4) -> int:
        """Bytes for the embedding and output layer; 0 means the same as bytes_per_param
        (engines.EngineProfile.non_matrix_optimizer_bytes)."""
        return 0 if self.non_matrix_states is None else self.non_matrix_states * state_bytes


_ADAM = ("torch.optim.Adam/AdamW (torch 2.13 torch/optim/adam.py _init_group: state['exp_avg'] and "
         "state['exp_avg_sq'] = torch.zeros_like(p)); Megatron-Core TE FusedAdam and DeepSpeed FusedAdam keep the "
         "same two moments")
OPTIMIZERS = {o.name: o for o in (
    OptimizerStates("adam", 2, source=_ADAM),
    OptimizerStates("adamw", 2, source=_ADAM),
    OptimizerStates("adam_amsgrad", 3, source=_ADAM + "; amsgrad adds state['max_exp_avg_sq']"),
    OptimizerStates("lamb", 2, source="LAMB (You et al. 2020) keeps Adam's two moments (DeepSpeed FusedLamb: "
                                      "exp_avg, exp_avg_sq)"),
    OptimizerStates("sgd_momentum", 1, source="torch.optim.SGD with momentum != 0: state['momentum_buffer'], a clone "
                                              "of the first gradient (torch/optim/sgd.py)"),
    OptimizerStates("sgd", 0, source="torch.optim.SGD with momentum = 0 keeps no state (momentum_buffer stays None)"),
    OptimizerStates("adagrad", 1, source="torch.optim.Adagrad: state['sum'] (torch/optim/adagrad.py)"),
    OptimizerStates("lion", 1, source="Lion (Chen et al. 2023): one momentum, exp_avg"),
    OptimizerStates("came", 1, source="CAME (Luo et al. 2023), MindFormers core/optim/came.py:350-398 at fd4deebc: "
                                      "exp_avg, a clone of the parameter, when beta1 > 0 (default 0.9); the second "
                                      "moments of matrices are factored into row and column vectors (negligible)"),
    OptimizerStates("came_no_momentum", 0, source="CAME with beta1 = 0: no exp_avg (came.py:352-357); factored "
                                                  "second moments only"),
    OptimizerStates("muon", 1, non_matrix_states=2,
                    source="Muon (Jordan et al. 2024; Liu et al. 2025, Moonlight): one momentum buffer per hidden "
                           "matrix; the embedding, output layer and 1-D parameters are updated by AdamW (two moments). "
                           "MindFormers core/optim/muon.py:355-398 at f52743ca: muon_m = param.clone('zeros') on every "
                           "2-D/3-D weight but word_embeddings and output_layer (GPTModel.get_muon_filter, "
                           "parallel_core/training_graph/base_models/gpt/gpt_model.py:864-876), adam_m and adam_v = "
                           "param.clone('zeros') on the rest: all in the parameter dtype"),
    OptimizerStates("pma_adamw", 3,
                    source="MindFormers PmaAdamW (core/optim/pma_adamw.py:195 at f52743ca; fused: "
                           "fused_pma_adamw.py:198): AdamW's exp_avg and exp_avg_sq (adamw.py:167-168; fused_adamw.py:"
                           "168-169) and pma_weight, each clone_state(), a float32 Parameter of the parameter's shape "
                           "(adamw.py:170-192; fused_adamw.py:182-204)"),
    OptimizerStates("pma_adamw_amsgrad", 4,
                    source="MindFormers PmaAdamW with use_fused and amsgrad: FusedAdamW adds max_exp_avg_sq "
                           "(fused_adamw.py:173 at f52743ca) to the three fp32 states of pma_adamw"),
    OptimizerStates("mindspore_sgd", 2,
                    source="MindSpore nn.SGD (mindspore-ai/mindspore@5f31f425 mindspore/python/mindspore/nn/optim/"
                           "sgd.py:199-200): accum (zeros) and stat (ones) = self._parameters.clone(...), whatever the "
                           "momentum; ParameterTuple.clone keeps each parameter's shape and dtype "
                           "(common/parameter.py)"),
    OptimizerStates("mindspore_momentum", 1,
                    source="MindSpore nn.Momentum (mindspore-ai/mindspore@09fe5b6f mindspore/python/mindspore/nn/optim/"
                           "momentum.py:207): moments = self.params.clone(prefix='moments', init='zeros'), in the "
                           "parameter's dtype"),
)}


def states(name: str, field: str = "optimizer") -> OptimizerStates:
    """The optimizer called ``name`` (this table's spelling); one line naming the field otherwise."""
    if name not in OPTIMIZERS:
        raise NdplanError(field, name, "an optimizer ndplan does not model", f"choose one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def engine_settings(opt: OptimizerStates, state_bytes: int = 4) -> dict[str, int]:
    """engines.derive settings for ``opt`` with states of ``state_bytes`` bytes each."""
    out = {"optimizer_bytes": opt.bytes_per_param(state_bytes)}
    if opt.non_matrix_states is not None:
        out["non_matrix_optimizer_bytes"] = opt.non_matrix_bytes(state_bytes)
    return out
