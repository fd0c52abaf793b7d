"""Float linear layers for CPU inference, on the GEMM kernel that is fast for each row count.

Owns: :class:`CpuLinear` — ``y = x @ weight.T + bias`` holding the weight twice, laid out for
the two kernels that are fast on x86 CPUs at decode sizes — the transposed weight [in, out]
for MKL's plain ``x @ W`` (one row: a one-token step; or a small product), and a
oneDNN-packed weight for more work (a verify of K+1 tokens, a prefill) — and
:func:`use_cpu_linears`, which swaps every float ``nn.Linear`` of a model for one (inference
only).

Why: PyTorch's ``F.linear`` calls MKL's ``x @ W.T``, whose cost on this project's AMD EPYC VM
grows with every row (a 5-row product costs ~5 one-row ones: a verify of K+1 tokens paid for
K+1 steps' worth of GEMM time), and whose one-row product is slower than ``x @ W`` on a
transposed copy. Measured (thread CPU time, all 33 linears of the embedded target's fused
forward, weights streamed from memory): one row 3.05 → 2.08 ms, five rows 4.96 → 2.30 ms
(``benchmarks/models.py --linears`` measures them on the machine at hand).

Does not know: models, devices other than the CPU (GPU models keep ``nn.Linear``), int8
(``engine.int8``'s own kernels).
"""

from __future__ import annotations

import torch
from torch import nn

# rows × in × out from which oneDNN's packed kernel beats MKL's x @ W: MKL's cost grows with
# the rows, oneDNN's barely, but each oneDNN call costs ~13 µs (measured on this project's AMD
# EPYC VM: at 1536 × 256, 28 / 55 / 112 µs against 43 / 42 / 59 µs for 1 / 2 / 5 rows)
ONEDNN_MIN_WORK = 400_000


def _onednn_available() -> bool:
    try:
        w = torch.zeros(2, 2)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2), packed, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError):
        return False


class CpuLinear(nn.Module):
    """An inference-only linear layer (float32, CPU) on the kernel that suits its row count."""

    def __init__(self, linear: nn.Linear, packed_rows: int = 8):
        super().__init__()
        weight = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_t = weight.t().contiguous()  # [in, out]: one row, MKL's x @ W
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(weight, packed_rows)
                       if ONEDNN else None)  # several rows: oneDNN
        self.size = self.in_features * self.out_features

    def __deepcopy__(self, memo) -> CpuLinear:  # oneDNN's packed weight is opaque to copy
        twin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            twin.weight.copy_(self.weight)
            if self.bias is not None:
                twin.bias.copy_(self.bias)
        return CpuLinear(twin)

    @property
    def weight(self) -> torch.Tensor:
        """The weight [out, in] (a view of the transposed copy)."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x [..., in] → [..., out]
        rows = x.reshape(-1, self.in_features)  # [N, in]
        if self.packed is not None and rows.shape[0] * self.size >= ONEDNN_MIN_WORK:
            out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [],
                                                      "")
        elif self.bias is None:
            out = torch.mm(rows, self.weight_t)
        else:
            out = torch.addmm(self.bias, rows, self.weight_t)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, cpu"


ONEDNN = _onednn_available()


def use_cpu_linears(model: nn.Module) -> nn.Module:
    """Every float32 ``nn.Linear`` of ``model`` (on the CPU) as a :class:`CpuLinear`, in
    place; returns the model. A tied LM head keeps its embedding (the embedding is a lookup)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and child.weight.device.type == "cpu" and \
                child.weight.dtype == torch.float32:
            setattr(model, name, CpuLinear(child))
        else:
            use_cpu_linears(child)
    return model
