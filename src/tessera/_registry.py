"""Op specs, backends and backend selection.

Every op is described once by an :class:`OpSpec` (public function, float64
reference, plain-PyTorch baseline, dtypes, test cases, bytes/FLOPs model) and
implemented per backend by a *kernel module*: a Python module that exports
``forward``/``backward`` launchers and ``DTYPES``.  Tests (``tests/test_matrix.py``),
``tessera check`` and ``tessera bench`` are all generated from the specs.

Backend selection for one call, first match wins:

1. ``backend=`` passed to the public function;
2. the innermost ``with tessera.use_backend(name):`` block;
3. the ``TESSERA_BACKEND`` environment variable;
4. automatic: by tensor device (``cpu`` -> native ``cpu``, ``cuda`` -> ``triton``).

An explicitly requested backend (1-3) that cannot run the op raises
:class:`BackendError`; it never falls back silently.  Automatic selection on a
CPU tensor only falls back to ``reference`` when the native backend cannot be
built here (no C compiler), and warns once when it does.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import warnings
from typing import Any, Callable, Iterator

import torch

from . import _env

# "cpu:aarch64"/"cpu:riscv64": edge CPUs, kernels cross-compiled into a remote runner (backends/cross.py)
CROSS_BACKENDS = ("cpu:aarch64", "cpu:riscv64")
BACKENDS = ("reference", "cpu", "triton", "opencl") + CROSS_BACKENDS
_override: contextvars.ContextVar[str] = contextvars.ContextVar("tessera_backend", default="")


class BackendError(RuntimeError):
    """An explicitly requested backend cannot run this op on these inputs."""


def bf16_compute_if(arg: str) -> Callable[[dict], str]:
    """An ``OpSpec.compute_dtype`` for an op whose bf16 input ``arg`` lets some route run bf16
    arithmetic (VDPBF16PS, AMX through oneDNN): "bf16" when ``kw[arg]`` is bf16, else "fp32"."""
    return lambda kw: "bf16" if kw[arg].dtype == torch.bfloat16 else "fp32"


@dataclasses.dataclass(frozen=True)
class Case:
    """One correctness/benchmark case of an op.

    ``make(dtype, device, gen)`` returns the keyword arguments of the public
    function (tensors are created on ``device`` in ``dtype``).  ``tags`` drive
    which suites run it: ``"large"`` (skipped under the Triton interpreter),
    ``"extreme"`` (extreme values), ``"layout"`` (non-contiguous/broadcast),
    ``"nograd"`` (forward only).
    """

    name: str
    make: Callable[[torch.dtype, torch.device, torch.Generator], dict]
    tags: frozenset = frozenset()


@dataclasses.dataclass
class OpSpec:
    """The contract of one op.  See ``docs/adding-an-op.md``."""

    name: str
    fn: Callable[..., Any]                 # public function, accepts backend=
    ref: Callable[..., Any]                # float64 reference: same kwargs, returns tensor or tuple
    eager: Callable[..., Any]              # plain PyTorch in the input dtype (2x rule + bench baseline)
    kernels: dict[str, str]                # backend name -> kernel module path
    cases: list[Case]
    grad_inputs: tuple[str, ...]           # kwargs that receive gradients
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    # bytes moved / flops for a call, given the kwargs: used by the roofline in `tessera bench`.
    bytes_fwd: Callable[[dict], int] | None = None
    bytes_bwd: Callable[[dict], int] | None = None
    flops_fwd: Callable[[dict], int] | None = None
    flops_bwd: Callable[[dict], int] | None = None
    # which ceiling `tessera bench` states the speed against: "memory" (GB/s vs an NT copy of
    # the row's bytes), "read" (an op whose bytes are all reads, e.g. a KV cache or a GEMV's
    # weight: GB/s vs a read-only pass over them) or "compute" (GFLOP/s vs an fp32 matmul), each
    # timed with the row
    # the row's own ceiling, timed in the same interleaved loop as the contenders; may also be a
    # function of the kwargs (a quantized GEMV is memory-bound, the same op's GEMM compute-bound)
    bound: str | Callable[[dict], str] = "memory"
    # the dtype of a compute-bound row's arithmetic, which picks its ceiling among the peaks
    # measured in the bench header: "fp32" (FMA), "bf16" (VDPBF16PS / AMX) or "int8" (VPDPBUSD /
    # AMX); a string or a function of the kwargs (attention's bf16 scores use VDPBF16PS)
    compute_dtype: str | Callable[[dict], str] = "fp32"
    # a plain read of exactly the bytes the op must read, in the order its memory layout allows
    # (a paged KV cache through its block table), with no compute: factory(kwargs) -> no-arg
    # callable, or None where there is none (another device).  `tessera bench` times it in the
    # row's loop and states the op's rate as a fraction of it beside the ceiling above: pages
    # scattered in memory read slower than the one linear buffer of the read pass
    layout_read: Callable[[dict], Any] | None = None
    bench_cases: list[Case] = dataclasses.field(default_factory=list)
    # per-output fp32 tolerance override {output index: (rtol, atol)} with a written reason
    fp32_tol: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    fp32_grad_tol: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    # outputs whose dtype does not follow the input dtype {output index: dtype}, e.g. an fp32
    # log-sum-exp next to a bf16 output; they are judged by that dtype's tolerance rule
    out_dtypes: dict[int, torch.dtype] = dataclasses.field(default_factory=dict)
    # property-based fuzzing: "rows" = the generic shape/stride fuzz of tests/test_fuzz.py
    # (row-wise ops: activations and per-feature parameters); an op whose inputs have other
    # roles (tables, indices, sequence metadata) names its own hypothesis test file instead
    fuzz: str = "rows"
    # arguments the op writes in place (a KV cache); the generic planted-bug checker
    # (tests/test_checker.py) cannot patch such outputs, so these ops carry their own
    # golden-vector and cross-backend bit-exactness tests
    mutates: tuple[str, ...] = ()
    # other libraries' kernels timed beside eager/compile in forward bench rows, e.g. torch's
    # int8/int4 CPU GEMMs or ONNX Runtime: {name: factory(kwargs) -> no-arg callable, or a str
    # saying why the peer cannot run here}.  Factories do their one-off setup (weight packing,
    # session building) outside the timed region.
    peers: dict[str, Callable[[dict], Any]] = dataclasses.field(default_factory=dict)
    # tensor arguments that may legally be 0-d (a per-tensor quantization scale); every other
    # tensor argument of a multi-input op must reject a 0-d tensor (tests/test_errors.py)
    scalar_ok: tuple[str, ...] = ()


OPS: dict[str, OpSpec] = {}


def register_op(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} registered twice")
    OPS[spec.name] = spec
    return spec


# ----------------------------------------------------------------------------- backends

def backend_available(name: str, device: torch.device) -> tuple[bool, str]:
    """Can backend ``name`` run on tensors of ``device`` on this machine? -> (ok, reason)."""
    if name == "reference":
        return True, ""
    if name == "cpu":
        if device.type != "cpu":
            return False, f"the cpu backend runs on CPU tensors, got device {device}"
        from .backends import cpu as _cpu
        return _cpu.available()
    if name == "triton":
        from .backends import triton as _tr
        return _tr.available(device)
    if name == "opencl":
        from .backends import opencl as _ocl
        return _ocl.available(device)
    if name in CROSS_BACKENDS:
        from .backends import cross as _cross
        return _cross.available(name, device)
    return False, f"unknown backend {name!r}; expected one of {BACKENDS}"


def native_backends(device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The backends other than ``reference`` that can run on tensors of ``device`` on this machine
    (cpu; triton on CPU only under TRITON_INTERPRET=1; opencl where a device is found), in
    ``BACKENDS`` order: what generic tests and ``tessera check`` iterate over."""
    dev = torch.device(device)
    return tuple(b for b in BACKENDS if b != "reference" and backend_available(b, dev)[0])


def forward_only(op: str, backend: str):
    """The ``backward`` of a kernel module that has no backward kernel yet (``BACKWARD = False``):
    a differentiable call on that backend raises BackendError instead of returning anything."""
    def backward(*args, **kwargs):
        raise BackendError(f"tessera.{op}: backend {backend!r} has only a forward kernel for {op}; "
                           f"its gradient is not implemented there (use the cpu or triton backend to train)")
    return backward


def has_backward(spec: OpSpec, backend: str) -> bool:
    """False for a kernel module that declares ``BACKWARD = False`` (forward-only on that backend)."""
    mod = kernel_module(spec, backend)
    return mod is not None and getattr(mod, "BACKWARD", True)


def kernel_module(spec: OpSpec, backend: str):
    path = spec.kernels.get(backend)
    if path is None:
        return None
    if backend in CROSS_BACKENDS:  # one launcher file serves every edge CPU: bind it to this one
        from .backends import cross as _cross
        return _cross.bind(importlib.import_module(path), backend)
    return importlib.import_module(path)


def supports(spec: OpSpec, backend: str, device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """The ``supports(op, inputs)`` of the backend interface, as (ok, reason)."""
    if backend not in BACKENDS:
        return False, f"unknown backend {backend!r}; expected one of {BACKENDS}"
    if backend not in spec.kernels:
        return False, f"backend {backend!r} has no kernel for op {spec.name!r}"
    ok, why = backend_available(backend, device)
    if not ok:
        return False, why
    mod = kernel_module(spec, backend)
    if dtype not in mod.DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in mod.DTYPES)
        return False, f"backend {backend!r} does not implement {spec.name} for dtype {dtype} (has: {names})"
    return True, ""


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force a backend for every tessera op called inside the block."""
    if name not in BACKENDS and name != "":
        raise ValueError(f"use_backend: unknown backend {name!r}; expected one of {BACKENDS}")
    token = _override.set(name)
    try:
        yield
    finally:
        _override.reset(token)


def requested_backend(explicit: str | None) -> str:
    """The explicitly requested backend name, or "" for automatic selection."""
    if explicit:
        return explicit
    return _override.get() or _env.get("TESSERA_BACKEND")


_warned_fallback = False
_selected: dict[tuple, Any] = {}


def select(spec: OpSpec, device: torch.device, dtype: torch.dtype, explicit: str = ""):
    """Pick the kernel module for one call; raises BackendError for impossible explicit requests.

    Successful choices are memoised per (op, requested backend, device type, dtype):
    the answer depends only on those and on the machine, and this is the launch path.
    TRITON_INTERPRET is part of the key because it decides whether triton runs on CPU, and
    TESSERA_OPENCL_DEVICE (for opencl requests) because it decides whether a device is found.
    """
    name = requested_backend(explicit)
    if name and name not in BACKENDS:
        # a misspelt name is bad input (ValueError naming where it came from), not an unavailable backend
        where = "argument 'backend'" if explicit else "environment variable TESSERA_BACKEND"
        raise ValueError(f"tessera.{spec.name}: {where}={name!r} is not a backend; expected one of {BACKENDS}")
    # (TESSERA_OPENCL_DEVICE decides whether an opencl request can run: read only for that request)
    key = (spec.name, name, device.type, dtype, _env.get("TRITON_INTERPRET"),
           _env.get("TESSERA_OPENCL_DEVICE") if name == "opencl" else "")
    mod = _selected.get(key)
    if mod is None:
        mod = _selected[key] = _select(spec, device, dtype, name)
    return mod


def _select(spec: OpSpec, device: torch.device, dtype: torch.dtype, name: str):
    global _warned_fallback
    if name:
        ok, why = supports(spec, name, device, dtype)
        if not ok:
            raise BackendError(f"tessera.{spec.name}: backend {name!r} was requested but cannot run: {why}")
        return kernel_module(spec, name)
    order = ("cpu", "reference") if device.type == "cpu" else ("triton",)
    reasons = []
    for cand in order:
        ok, why = supports(spec, cand, device, dtype)
        if ok:
            if cand == "reference" and not _warned_fallback:
                _warned_fallback = True
                warnings.warn(f"tessera: native cpu backend unavailable ({reasons[-1]}); "
                              "using the float64 reference backend", RuntimeWarning, stacklevel=3)
            return kernel_module(spec, cand)
        reasons.append(why)
        if cand == "cpu" and backend_available("cpu", device)[0]:
            # the native backend exists but lacks this op/dtype: that is an error, not a reason to
            # fall back (the float64 reference is only the stand-in for a machine without a compiler)
            break
    raise BackendError(f"tessera.{spec.name}: no backend can run dtype {dtype} on device {device}: "
                       + "; ".join(reasons))
