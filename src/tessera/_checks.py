"""Input validation shared by every op: clear ValueError/TypeError messages that
name the argument, what it is (shape/dtype/device) and what was expected."""
from __future__ import annotations

import math

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def describe(t) -> str:
    if not isinstance(t, torch.Tensor):
        return f"{type(t).__name__}"
    return f"shape={tuple(t.shape)} dtype={t.dtype} device={t.device}"


def tensor(op: str, name: str, t, *, dtypes=FLOAT_DTYPES, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tessera.{op}: argument '{name}' must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"tessera.{op}: argument '{name}' ({describe(t)}) has unsupported dtype; "
                        f"expected one of {names}")
    if t.dim() < min_dim:
        raise ValueError(f"tessera.{op}: argument '{name}' ({describe(t)}) must have at least "
                         f"{min_dim} dimension(s)")
    return t


def same_device(op: str, ref_name: str, ref: torch.Tensor, **others) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"tessera.{op}: argument '{name}' ({describe(t)}) is on a different device "
                             f"than '{ref_name}' ({ref.device}); expected all tensors on {ref.device}")


def same_shape(op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor) -> None:
    if t.shape != ref.shape:
        raise ValueError(f"tessera.{op}: argument '{name}' ({describe(t)}) must have the same shape as "
                         f"'{ref_name}' {tuple(ref.shape)}")


def same_dtype(op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"tessera.{op}: argument '{name}' ({describe(t)}) must have the same dtype as "
                        f"'{ref_name}' ({ref.dtype})")


def last_dim_vector(op: str, name: str, t: torch.Tensor, x_name: str, x: torch.Tensor) -> None:
    """A per-feature parameter (weight/bias): 1-D with size x.shape[-1]."""
    if t.dim() != 1 or t.shape[0] != x.shape[-1]:
        raise ValueError(f"tessera.{op}: argument '{name}' ({describe(t)}) must be 1-D of size "
                         f"{x.shape[-1]} (the last dimension of '{x_name}' {tuple(x.shape)})")


def finite_float(op: str, name: str, v, *, min_value: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"tessera.{op}: argument '{name}' must be a float, got {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v) or (min_value is not None and v < min_value):
        bound = f" and >= {min_value}" if min_value is not None else ""
        raise ValueError(f"tessera.{op}: argument '{name}'={v} must be finite{bound}")
    return v


def choice(op: str, name: str, v, allowed: tuple) -> None:
    if v not in allowed:
        raise ValueError(f"tessera.{op}: argument '{name}'={v!r} is not supported; expected one of {allowed}")


def backend_arg(op: str, backend) -> str:
    """The public functions' ``backend=`` keyword, checked before it reaches the custom op's schema
    (whose parser would raise a RuntimeError instead of a TypeError naming the argument)."""
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"tessera.{op}: argument 'backend' must be a str or None, got {type(backend).__name__}")
    return backend or ""


def python_types(op: str, tensors: dict, floats: dict | None = None) -> None:
    """Python types only, in the public function before the custom op's schema parser (whose
    errors are RuntimeErrors not naming the argument).  Cheap and traceable: values and shapes
    are checked inside the op, where torch.compile(dynamic=True) has concrete numbers.
    ``tensors`` maps name -> value; the first entry is required, the others may be None."""
    for i, (name, t) in enumerate(tensors.items()):
        if not isinstance(t, torch.Tensor) and (t is not None or i == 0):
            what = "a torch.Tensor" if i == 0 else "a torch.Tensor or None"
            raise TypeError(f"tessera.{op}: argument '{name}' must be {what}, got {type(t).__name__}")
    for name, v in (floats or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float, torch.SymFloat, torch.SymInt)):
            raise TypeError(f"tessera.{op}: argument '{name}' must be a float, got {type(v).__name__}")
