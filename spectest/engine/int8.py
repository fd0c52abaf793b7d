"""Int8 weights for CPU decode, computed so that a row's result never depends on its batch.

Owns: :class:`Int8Linear` — a linear layer whose weights are int8 per output channel,
prepacked for fbgemm (PyTorch's x86 quantized GEMM), with activations quantized to 8 bits
dynamically, one scale per row; :func:`quantize_int8`, which swaps every projection of a
:class:`~spectest.engine.model.Transformer` for one (fusing q/k/v and gate/up so a layer makes
four GEMM calls instead of seven) and frees the float weights; :func:`should_quantize`, the
``--quantize auto`` rule.

Why per row: fbgemm's dynamic linear picks one activation scale for the whole input, so a row
verified beside K others would be rounded differently from the same row decoded alone, and
greedy speculative output would drift from target-only output. Here every row is divided by
its own max-abs before the call and multiplied back after, and two constant columns (+1, −1,
with zero weights) pin the tensor's range to exactly [−1, 1] whatever the batch holds. The
integer GEMM is exact, so verify(K+1) and step(1) produce bit-identical logits for the same row.

Why int8 at all: SmolLM2-135M reads 540 MB of fp32 weights per token, so a one-row step is
memory-bound and a (K+1)-row verify costs well over a step in fp32 GEMMs. Int8 weights read a
quarter of that, which shortens both (``benchmarks/models.py --pair smollm2``; figures in
docs/results.md). The tiny embedded pair is overhead-bound and stays fp32.

CPU only: ``should_quantize`` refuses int8 on another device. Does not know: files, sampling,
speculation. The embedding table stays float (a lookup reads
one row); a tied LM head gets its own int8 copy. ``torch.ao`` quantized tensors are deprecated
upstream; they are used only to build the packed weight, behind a warnings filter.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from spectest.engine.model import Transformer

QUANTIZE_CHOICES = ("auto", "none", "int8")
AUTO_INT8_MIN_PARAMS = 50_000_000  # below this a step is Python overhead, not weight reads
CACHED_ROWS = 64  # input buffers kept per layer for batches up to this many rows


class Int8Linear(nn.Module):
    """``y = x @ weight.T + bias`` with int8 weights and per-row 8-bit activations."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        out_features, in_features = weight.shape
        self.in_features, self.out_features = in_features, out_features
        # two extra input columns with zero weights carry the +1 / −1 range pins
        padded = torch.cat([weight.detach().float(), weight.new_zeros(out_features, 2).float()],
                           dim=1)  # [out, in + 2]
        scales = (padded.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()  # [out]
        zero_points = torch.zeros(out_features, dtype=torch.long)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(padded, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = None if bias is None else bias.detach().float().clone()
        self._inputs: dict[int, torch.Tensor] = {}  # rows → reusable [rows, in + 2] buffer

    def _input_buffer(self, rows: int) -> torch.Tensor:
        """A [rows, in + 2] buffer with the range pins set; kept for decode-sized batches
        only (a prefill's row count is the prompt length: caching those would hoard memory)."""
        buf = self._inputs.get(rows)
        if buf is None:
            buf = torch.empty(rows, self.in_features + 2)
            buf[:, -2], buf[:, -1] = 1.0, -1.0
            if rows <= CACHED_ROWS:
                self._inputs[rows] = buf
        return buf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in] → [..., out]
        rows_in = x.reshape(-1, self.in_features)  # [N, in]
        # max |x| per row (amax, not vector_norm(inf): the same value, 3-6× cheaper for a few
        # rows here); + 1e-30 keeps an all-zero row zero
        row_scale = rows_in.abs().amax(dim=1, keepdim=True).add_(1e-30)  # [N, 1]
        buf = self._input_buffer(rows_in.shape[0])
        torch.div(rows_in, row_scale, out=buf[:, :self.in_features])
        # reduce_range=False: full 8-bit activations (exact on VNNI CPUs; older AVX2 fbgemm may
        # saturate int16 pair sums, which is still deterministic per row)
        out = torch.ops.quantized.linear_dynamic(buf, self._packed, False).mul_(row_scale)
        if self.bias is not None:
            out = out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The weights [out, in] as the int8 values times their scales (float)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qweight.dequantize()[:, :self.in_features]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _linear_int8(*linears: nn.Linear) -> Int8Linear:
    """One Int8Linear computing the given linears side by side (outputs concatenated)."""
    weight = torch.cat([lin.weight for lin in linears])
    biases = [lin.bias for lin in linears]
    if all(b is None for b in biases):
        bias = None
    else:
        bias = torch.cat([b if b is not None else lin.weight.new_zeros(lin.out_features)
                          for b, lin in zip(biases, linears)])
    return Int8Linear(weight, bias)


def quantize_layer_int8(layer: nn.Module) -> None:
    """One decoder layer's projections to int8, q/k/v and gate/up fused (in place)."""
    with torch.no_grad():
        attn, mlp = layer.self_attn, layer.mlp
        layer.plan = None  # its fast path is rebuilt from the new modules (freeze_plans)
        attn.qkv_proj = _linear_int8(attn.q_proj, attn.k_proj, attn.v_proj)
        attn.q_proj = attn.k_proj = attn.v_proj = None
        attn.o_proj = _linear_int8(attn.o_proj)
        mlp.gate_up_proj = _linear_int8(mlp.gate_proj, mlp.up_proj)
        mlp.gate_proj = mlp.up_proj = None
        mlp.down_proj = _linear_int8(mlp.down_proj)


def linear_int8(linear: nn.Linear) -> Int8Linear:
    with torch.no_grad():
        return _linear_int8(linear)


def quantize_int8(model: Transformer) -> Transformer:
    """Replace every projection of ``model`` with int8 (in place; returns the model)."""
    for layer in model.layers:
        quantize_layer_int8(layer)
    model.lm_head = linear_int8(model.lm_head)
    model.quantization, model.row_exact = "int8", True
    return model


def should_quantize(choice: str, model: Transformer, target_params: int | None = None,
                    device: torch.device = torch.device("cpu")) -> bool:
    """``--quantize``: ``int8`` / ``none``, or ``auto`` = int8 for models of ≥ 50M parameters
    on the CPU (never on a GPU: fbgemm is a CPU library; the weights are bf16/fp16 there). A
    draft follows its target (``target_params``: the target's count), so that greedy
    acceptance is the same wherever the draft runs."""
    if choice not in QUANTIZE_CHOICES:
        raise ValueError(f"unknown --quantize {choice!r} (choose from "
                         f"{', '.join(QUANTIZE_CHOICES)})")
    if device.type != "cpu":
        if choice == "int8":
            raise ValueError(f"--quantize int8 runs on the CPU only (fbgemm's int8 kernels); "
                             f"on {device} use --quantize none or auto (half-precision "
                             f"weights there, --dtype)")
        return False
    if choice == "auto":
        params = target_params or sum(p.numel() for p in model.parameters())
        return params >= AUTO_INT8_MIN_PARAMS
    return choice == "int8"
