"""HBM bytes of the loss's passes over the logits (formulas/step.loss_pass_bytes, the engines'
loss_bytes_forward / loss_bytes_backward in engine_time.py).

* torch's eager cross entropy (the fsdp profile, torchtitan without loss parallelism): the aten ops that touch the
  (tokens x vocab) tensors are read off a TorchDispatchMode run on the CPU, each op reading its
  full-size inputs once and writing its full-size outputs once, plus the passes the CUDA kernels
  make inside an op (written here from aten/src/ATen/native/cuda/SoftMax.cu: the forward's max and
  exp-sum reductions re-read the input, the backward's sum re-reads the gradient).
* Megatron-LM's unfused vocab-parallel cross entropy: its statements written out from
  core/tensor_parallel/cross_entropy.py at d98e8a64 (Megatron is not installed here).
* The step-time model: the head's forward and backward grow by exactly those bytes per logit
  element at the hardware's streaming bandwidth.
"""

import pytest

import ndplan
from ndplan.engines import profile
from ndplan.formulas.step import COMPILED_LOSS_PASS_BYTES, loss_pass_bytes

TOKENS, VOCAB = 64, 50_000


def _aten_bytes():
    """(forward, backward) bytes per logit element of F.cross_entropy(logits.float()) on bf16 logits,
    op by op as the dispatcher runs them (views and index-only accesses excluded)."""
    torch = pytest.importorskip("torch")
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import TorchDispatchMode
    full = TOKENS * VOCAB
    views = {"aten.detach.default", "aten.view.default", "aten.alias.default"}
    index_only = {"aten.nll_loss_forward.default": "reads", "aten.nll_loss_backward.default": "reads"}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.ops = 0, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            big = lambda ts: [t for t in pytree.tree_leaves(ts) if isinstance(t, torch.Tensor) and t.numel() == full]
            if name not in views:
                read = 0 if index_only.get(name) == "reads" else sum(t.element_size() for t in big((args, kwargs)))
                written = sum(t.element_size() for t in big(out))
                if read or written:
                    self.ops.append(name)
                self.bytes += read + written
            return out

    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))
    with Count() as fwd:
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
    with Count() as bwd:
        loss.backward()
    assert fwd.ops == ["aten._to_copy.default", "aten._log_softmax.default"]
    assert bwd.ops == ["aten.nll_loss_backward.default", "aten._log_softmax_backward_data.default",
                       "aten._to_copy.default"]
    return fwd.bytes, bwd.bytes  # element sizes summed: bytes per logit element


CUDA_SOFTMAX_EXTRA = (2 * 4, 4)
"""Re-reads inside the CUDA kernels (fp32): cunn_SoftMaxForward reads its input for the max, again
for the exp-sum, then once more as it writes (the op-level count has one read); cunn_SoftMaxBackward
reads the gradient for its sum, then with the output as it writes. Their shared-memory variants,
which read once, need the row within 48 KiB (12k fp32 elements): the count is the large-vocabulary
path (a 32k vocabulary split over tp >= 3 would take the variant; not modelled)."""


def test_torch_eager_cross_entropy():
    """Op by op: upcast (2 + 4), log-softmax (4 + 4), then backward nll_loss_backward's zero-filled
    fp32 gradient (4), log-softmax backward (4 + 4 + 4) and the cast back (4 + 2); with the CUDA
    re-reads: 22 forward, 26 backward."""
    fwd, bwd = _aten_bytes()
    assert (fwd, bwd) == (14, 22)
    assert loss_pass_bytes(profile("fsdp")) == (fwd + CUDA_SOFTMAX_EXTRA[0], bwd + CUDA_SOFTMAX_EXTRA[1])


def test_megatron_unfused_vocab_parallel_cross_entropy():
    """cross_entropy.py at d98e8a64, per element of the local logits: forward
    vocab_parallel_logits.float() (:25, read 2 write 4), torch.max (:27, read 4), ``-= logits_max``
    (:42, read 4 write 4), torch.exp(out=) (:62, read 4 write 4), .sum (:63, read 4), exp_logits.div_
    (:77, read 4 write 4); backward grad_input.mul_ (:114, read 4 write 4) and autograd's cast of
    the fp32 gradient to the bf16 input's dtype (read 4 write 2)."""
    forward = (2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4)
    backward = (4 + 4) + (4 + 2)
    assert loss_pass_bytes(profile("megatron")) == (forward, backward) == (38, 14)
    # Megatron-DeepSpeed upcasts, then runs its copy of the function (megatron/model/gpt_model.py:314)
    assert loss_pass_bytes(profile("deepspeed")) == (38, 14)


def test_compiled_loss_takes_the_fused_passes():
    assert loss_pass_bytes(profile("fsdp[compiled_loss=1]")) == COMPILED_LOSS_PASS_BYTES


@pytest.mark.parametrize("engine", ["megatron", "fsdp"])
def test_head_time_grows_by_the_loss_bytes(engine):
    """Doubling the vocabulary adds the output layer's forward and two backward GEMMs over the
    added columns and the loss's passes over the added logits, at the streaming bandwidth."""
    import dataclasses
    hw = ndplan.load_hardware("h100-sxm")
    base = ndplan.load_model("llama2-7b")
    s = 4096
    strat = ndplan.Strategy(seq=s, gbs=1, mbs=1, zero=0, engine=engine)
    times = {}
    for v in (32000, 64000):
        model = dataclasses.replace(base, vocab_size=v)
        times[v] = ndplan.estimate(model, hw, strat, 1).time_terms["time.compute"]
    dv = 32000
    gemm = 3 * 2 * s * base.hidden_size * dv / (hw.bf16_tflops * 1e12 * hw.gemm_efficiency)
    f, b = loss_pass_bytes(profile(engine))
    loss = (f + b) * s * dv / (hw.hbm_gb_per_s * 1e9 * hw.hbm_efficiency)
    assert times[64000] - times[32000] == pytest.approx(gemm + loss, rel=1e-9)
