"""Where the engine's tensors live: the one module that knows about devices.

Owns: the ``--device`` and ``--dtype`` choices (``auto`` = CUDA when torch sees a GPU, else
the CPU), :class:`Placement` — a device and the dtype of the weights there — and every crossing
between the host and that device:

* :meth:`Placement.to_device` / :func:`to_device`: host data (Python lists, NumPy arrays, CPU
  tensors) onto the device without making the host wait: pinned memory and a non-blocking copy
  on CUDA (a plain ``.to("cuda")`` from pageable memory synchronises the stream);
* :func:`copy_into`: host values into an existing device tensor, the same way;
* :func:`fetch`: device tensors back to the host as NumPy arrays, packed into ONE transfer —
  the only place a round waits for the device (``engine.syncs`` counts it);
* :meth:`Placement.generator`: a per-request random generator on the device (a CPU generator
  cannot draw CUDA tensors);
* :meth:`Placement.place_model`: a model moved to the device in its dtype;
* :meth:`Placement.synchronize`: for profiling only (``spectest profile``).

The engine keeps its bookkeeping on the host — sequence lengths, which rows draft and how many
drafts each row may make are Python ints and NumPy arrays — and tensors hold device data only.
That is what lets a round wait for the device once, for the accept decision, and it is also
what ``engine.syncs`` checks on the CPU: there every tensor is "on the device", so any tensor
read back into Python is a place where a GPU would stall.

Weights: fp32 on the CPU (int8 is ``engine.int8``'s, CPU-only: fbgemm); on CUDA bf16 where the
card has it (fp16 otherwise) for models of at least ``HALF_MIN_PARAMS`` parameters, whose steps
read their weights; smaller ones (the embedded pair: launch-bound, its weights are 29 MB) stay
fp32, where a (K+1)-row verify and a one-row step round alike, so greedy speculation keeps
matching target-only output.

Does not know: models beyond their parameters, requests or speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
HALF_MIN_PARAMS = 50_000_000  # below this a GPU step is launches, not weight reads: keep fp32


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(choice: str | torch.device = "auto") -> torch.device:
    """``auto`` / ``cpu`` / ``cuda`` / ``cuda:N`` → a device torch can use here (a clear
    ValueError when CUDA is asked for and absent)."""
    name = str(choice)
    if name == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown --device {name!r} (choose from "
                         f"{', '.join(DEVICE_CHOICES)})") from None
    if device.type == "cuda" and not cuda_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "torch sees no GPU")
        raise ValueError(f"--device {name}: {why} (torch {torch.__version__}); use "
                         f"--device cpu or auto")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {name}: only cpu and cuda are supported")
    return device


def weight_dtype(device: torch.device, choice: str = "auto",
                 n_params: int | None = None) -> torch.dtype:
    """The dtype of the weights on ``device`` for ``--dtype choice`` (see the module doc)."""
    if choice not in DTYPE_CHOICES:
        raise ValueError(f"unknown --dtype {choice!r} (choose from {', '.join(DTYPE_CHOICES)})")
    if choice != "auto":
        dtype = getattr(torch, choice)
        if device.type == "cpu" and dtype != torch.float32:
            raise ValueError(f"--dtype {choice} on the CPU: the engine runs fp32 (or int8 "
                             f"with --quantize int8) there")
        return dtype
    if device.type != "cuda" or (n_params is not None and n_params < HALF_MIN_PARAMS):
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def to_device(host, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host data → a tensor on ``device``, without waiting for the device. A tensor already
    there is returned as it is (cast to ``dtype`` if given)."""
    if isinstance(host, torch.Tensor):
        tensor = host
    else:  # through NumPy: a host tensor whatever torch's default device is
        tensor = torch.from_numpy(np.ascontiguousarray(host))
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if tensor.device == device or device.type == "cpu":
        return tensor if tensor.device == device else tensor.to(device)
    # pinned staging + non-blocking: the caching host allocator keeps the staging block until
    # the copy has run, so the host moves on at once
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_into(target: torch.Tensor, host: np.ndarray) -> None:
    """Host values into an existing device tensor of the same shape (a captured graph's
    static input), without waiting for the device."""
    source = torch.from_numpy(np.ascontiguousarray(host)).to(target.dtype)
    if target.device.type == "cuda":
        source = source.pin_memory()
    target.copy_(source, non_blocking=True)


def fetch(*tensors: torch.Tensor) -> list[np.ndarray]:
    """Device tensors → host NumPy arrays (same shapes), in one transfer: the host waits for
    the device here and nowhere else in a round. Integers come back int64, floats float64
    (both exact: token ids and fp32 values fit a float64)."""
    if not tensors:
        return []
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
    host = np.asarray(flat.tolist(), dtype=np.float64)  # the one wait
    out, at = [], 0
    for t in tensors:
        n = t.numel()
        part = host[at:at + n].reshape(tuple(t.shape))
        out.append(part.astype(np.int64) if not t.is_floating_point() else part)
        at += n
    return out


@dataclass(frozen=True)
class Placement:
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32  # of the floating-point weights (and the KV cache)

    @classmethod
    def of(cls, model: torch.nn.Module) -> Placement:
        """Where ``model``'s weights are (an int8 model: the CPU, fp32 activations)."""
        for p in model.parameters():
            return cls(p.device, p.dtype if p.is_floating_point() else torch.float32)
        return cls()

    @classmethod
    def choose(cls, device: str = "auto", dtype: str = "auto",
               n_params: int | None = None) -> Placement:
        where = resolve_device(device)
        return cls(where, weight_dtype(where, dtype, n_params))

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def describe(self) -> str:
        """The device in words (with the GPU's name)."""
        name = str(self.device)
        if self.cuda:
            name += f" ({torch.cuda.get_device_name(self.device)})"
        return name

    def place_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` on this device, its floating-point parameters in this dtype (buffers such
        as RoPE frequencies stay fp32)."""
        model.to(self.device)
        for param in model.parameters():
            if param.is_floating_point() and param.dtype != self.dtype:
                param.data = param.data.to(self.dtype)
        return model

    def to_device(self, host, dtype: torch.dtype | None = None) -> torch.Tensor:
        return to_device(host, self.device, dtype)

    def tokens(self, ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray) -> torch.Tensor:
        """Token ids (a list, a list of rows, or an array) → a long tensor on the device."""
        return to_device(np.asarray(ids, dtype=np.int64), self.device)

    def generator(self, seed: int | None) -> torch.Generator:
        """A per-request generator on this device, seeded (or from the host's entropy)."""
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed if seed is not None else
                        int(torch.randint(0, 2**62, (1,), device="cpu").item()))  # host RNG
        return gen

    def synchronize(self) -> None:
        """Wait for the device (profiling only: it splits a round's time into its phases)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
