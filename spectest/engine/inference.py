"""A loaded model made ready for the engine: its weights' kernels, device and fast paths.

Owns: :func:`prepare_for_inference`, in this order — int8 weights where asked
(``engine.int8``; CPU, fused projections of their own) or q/k/v and gate/up fused
(``model.fuse_projections``); the model moved to its device and dtype
(``engine.device.Placement``); float CPU projections on the GEMM kernels that suit decode
(``engine.cpu_linear``); every layer's plain-call fast path frozen
(``Transformer.freeze_plans``); and, on a GPU, decode and verify forwards replayed from
captured graphs (``engine.graphs``; before any KV cache is made for the model, since those
caches keep a scratch slot). ``engine.api.build_engine`` prepares every model it loads; an
engine built around an unprepared model runs its plain module path (the same numbers up to
rounding). Idempotent.

Does not know: requests, speculation or files. Inference only: a prepared model no longer
trains (its projections are fused and may be int8 or repacked).
"""

from __future__ import annotations

from spectest.engine.cpu_linear import use_cpu_linears
from spectest.engine.device import Placement
from spectest.engine.graphs import CapturedForwards
from spectest.engine.int8 import quantize_int8
from spectest.engine.model import Transformer, fuse_projections


def prepare_for_inference(model: Transformer, int8: bool = False,
                          place: Placement | None = None, graphs: bool = False) -> Transformer:
    """``model``, prepared in place (see the module doc); returns it."""
    if getattr(model, "prepared", False):
        return model
    if int8:
        quantize_int8(model)
    for layer in model.layers:
        fuse_projections(layer)
    if place is not None:
        place.place_model(model)
    if model.device.type == "cpu" and model.quantization != "int8":
        use_cpu_linears(model)
    model.freeze_plans()
    if graphs:
        model.graphs = CapturedForwards()
    model.eval().requires_grad_(False)
    model.prepared = True
    return model
