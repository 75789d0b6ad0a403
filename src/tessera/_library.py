"""Glue shared by the ``torch.library`` custom ops of every op.

Conventions every kernel module relies on:

* Kernels see *row views*: 2-D ``(rows, n)`` tensors whose last stride is 1 and
  whose row stride is arbitrary (0 for broadcast rows, > n for slices of a fused
  projection).  :func:`rows` makes one without copying when the layout allows it.
* Every buffer a kernel writes (forward outputs, backward gradients, fp32 parameter
  gradients, workspaces it fills) is allocated with :func:`new_output`: always
  contiguous, and filled with NaN ("poisoned") while :func:`poison_outputs` is active,
  so a test catches any element a kernel forgot to write. While a test installs a
  placement hook (:func:`placement`, used by :mod:`tessera.testing.fence`) the memory
  comes from that hook instead, flush against a page that faults, so a kernel writing
  past either end of its output crashes. The glue's own copies (:func:`rows` of a
  transposed input, :func:`as_fp32_param`, :func:`contiguous`) go through the same
  hook, so a kernel reading past them faults too. Without a hook both cost one list
  lookup.
* Custom ops are opaque to ``torch.compile``/``torch.export``; each has a fake
  kernel that allocates the same contiguous outputs.
"""
from __future__ import annotations

import contextlib
import os
import weakref
from typing import Iterator

import torch

_PARAMETER = torch.nn.Parameter
# what a signature cache may key on: plain tensors and parameters (fake / functional tensors under
# tracing may carry symbolic sizes, which must not be hashed into a key)
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def plain(*tensors) -> bool:
    """Is every argument a plain tensor or parameter (``PLAIN_TENSORS``)?"""
    for t in tensors:
        if type(t) not in PLAIN_TENSORS:
            return False
    return True


class SignatureCache(dict):
    """An op's memo of what a call derives from its signature alone (checks passed, normalised
    arguments, a launch plan), keyed by that signature.  ``lookup`` is None for a miss and for an
    unhashable key (a list argument: never cached); ``store`` clears the memo past ``LIMIT``
    entries, so a process calling with ever-new shapes cannot grow it without bound."""

    LIMIT = 4096

    def lookup(self, key):
        try:
            return self.get(key)
        except TypeError:
            return None

    def store(self, key, value):
        if len(self) > self.LIMIT:
            self.clear()
        try:
            self[key] = value
        except TypeError:
            pass
        return value

_POISON = [False]
_PLACE = [None]  # (shape, dtype, device) -> contiguous tensor, or None: plain torch.empty


@contextlib.contextmanager
def poison_outputs(enabled: bool = True) -> Iterator[None]:
    """Fill every kernel output with NaN (floats) / -1 (ints) before the kernel writes it."""
    prev = _POISON[0]
    _POISON[0] = enabled
    try:
        yield
    finally:
        _POISON[0] = prev


@contextlib.contextmanager
def placement(alloc) -> Iterator[None]:
    """Allocate every kernel-written buffer and glue copy with ``alloc(shape, dtype, device)``
    (a contiguous tensor) instead of ``torch.empty``; ``None`` restores the default."""
    prev = _PLACE[0]
    _PLACE[0] = alloc
    try:
        yield
    finally:
        _PLACE[0] = prev


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A contiguous buffer for a kernel to write: poisoned and placed while a test asks."""
    place = _PLACE[0]
    if place is not None:
        out = place(shape, dtype, device)
    elif len(shape):  # sizes unpacked: torch parses them ~0.5 us faster than one tuple
        out = torch.empty(*shape, dtype=dtype, device=device)
    else:
        out = torch.empty((), dtype=dtype, device=device)
    if _POISON[0] and out.numel():
        out.fill_(float("nan") if out.is_floating_point() else -1)
    return out


def shaped(t: torch.Tensor, shape) -> torch.Tensor:
    """``t.view(shape)``, with the sizes unpacked: torch parses ``view(*sizes)`` ~2 us faster
    than ``view(torch.Size)``, which is most of a tiny decode-time call's reshape cost."""
    if t.shape == shape:  # a 2-D op's output already has it: no view object at all
        return t
    return t.view(*shape) if len(shape) else t.view(shape)


def rows(t: torch.Tensor) -> torch.Tensor:
    """View ``t`` as (rows, last_dim) with unit inner stride, copying only when impossible.

    ``view`` succeeds whenever the leading dims collapse to one stride: contiguous
    tensors, row slices of a wider buffer, and broadcast rows (all strides 0).
    """
    if t.dim() == 0:
        return t.reshape(1, 1)
    n = t.shape[-1]
    if t.stride(-1) != 1 and n > 1:
        t = contiguous(t)
    if t.dim() == 1:
        return t.unsqueeze(0)
    if t.dim() == 2 and n:  # already a row view (what view(-1, n) would return, ~1.6 us less)
        return t
    try:
        return t.view(-1, n)
    except RuntimeError:
        return contiguous(t).view(-1, n)


def as_fp32_param(t: torch.Tensor | None) -> torch.Tensor | None:
    """Per-feature parameters (weight/bias) are small: kernels take them as contiguous fp32."""
    if t is None:
        return None
    if t.dtype == torch.float32 and t.is_contiguous():
        return t                                   # the common case, on every launch: no call at all
    if _PLACE[0] is None:
        return t.to(torch.float32).contiguous()
    return _placed_copy(t, torch.float32)


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t.contiguous()`` for the glue (weights, scales, saved statistics handed to a kernel): a
    copy, when one is needed, comes from the placement hook under test like :func:`rows`'."""
    if t is None:
        return None
    if _PLACE[0] is None or t.is_contiguous():
        return t.contiguous()
    return _placed_copy(t)


def _placed_copy(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``t.to(dtype).contiguous()`` in memory from the placement hook (the copy a kernel reads
    must be fenced like the tensor it was copied from)."""
    out = _PLACE[0](tuple(t.shape), t.dtype if dtype is None else dtype, t.device)
    out.copy_(t)
    return out


_MEMO: dict = {}  # (id(tensor), key) -> (weakref, (version, ptr, strides, dtype), value)


def per_tensor(t: torch.Tensor, key, build):
    """``build()`` memoised per (tensor, key): what a kernel derives from a weight (packed, permuted,
    its row sums) is computed once, not on every inference call -- a 512x512x3x3 int8 permute
    alone cost 1.2 ms, more than the conv.  The entry holds while the tensor object lives and
    its version counter, storage address, strides and dtype are unchanged (an in-place update,
    e.g. an optimizer step, bumps the version and rebuilds); it dies with the tensor.  Not used
    while a test places buffers (fence) or for inference-mode tensors (no version counter)."""
    if _PLACE[0] is not None or t.is_inference():
        return build()
    k = (id(t), key)
    stamp = (t._version, t.data_ptr(), t.stride(), t.dtype)
    ent = _MEMO.get(k)
    if ent is not None and ent[0]() is t and ent[1] == stamp:
        return ent[2]
    value = build()
    _MEMO[k] = (weakref.ref(t, lambda _r, k=k: _MEMO.pop(k, None)), stamp, value)
    return value


def direct(op, impl, *tensors):
    """``op`` (the ``tessera::`` custom op) or, when nothing can tell the difference, ``impl``
    (the same Python function undecorated) to skip the dispatcher's ~20-30 us per call.

    The custom op is what autograd, torch.compile/export, fake/meta tensors, vmap,
    dispatch/function modes (profilers, FlopCounter, DebugMode, ``with torch.device``)
    and tensor subclasses see; it is always used when any of those could be involved
    or an input requires grad.  A plain eager call on plain CPU/CUDA tensors without
    grad runs the identical body directly, so tiny decode-time calls cost what the
    kernel costs.  ``TESSERA_ALWAYS_DISPATCH=1`` turns the shortcut off.  For the few ops
    with a C++ twin of that body (:mod:`tessera._fastpath`: contiguous cpu inputs; it hands
    every other case back to ``impl``) the twin is returned instead.
    """
    # This is every call.  is_compiling() stays first: under dynamo it folds to True and nothing
    # after it is traced.  Once the C++ fast path has loaded, its gate() makes every other test
    # below (~0.15 us in all); this Python body is its specification and the path before then:
    # torch._C's own tracing/mode/profiler queries (~0.07 us each) rather than their Python
    # wrappers, is_cpu/is_cuda rather than t.device.type (which builds a device object).
    if torch.compiler.is_compiling():
        return op
    if _GATE[0] is not None:
        return _GATE[0](op, impl, *tensors)
    if (_ALWAYS_DISPATCH[0] or _is_tracing()
            or _profiler_enabled()  # profiles show tessera:: ops by name
            or _dispatch_modes() or _function_modes()):
        return op
    grad = _grad_enabled()
    for t in tensors:
        if t is None:
            continue
        # nn.Parameter (every model's weights) is a plain tensor here: no __torch_function__ of its own
        if (type(t) is not torch.Tensor and type(t) is not _PARAMETER) or (grad and t.requires_grad) \
                or not (t.is_cpu or t.is_cuda):
            return op
        if _functorch_wrapped(t):
            return op
    # the same body in C++ (_fastpath) where one exists; it hands any case it does not cover
    # back to impl.  Not while a test poisons or fences outputs (its allocations are ATen's own),
    # nor while os.environ is a stand-in mapping (it reads the process environment)
    if _POISON[0] or _PLACE[0] is not None or os.environ is not _PROCESS_ENVIRON:
        return impl
    return _FAST.get(impl, impl)


_is_tracing = torch._C._is_tracing  # torch.jit.is_tracing() less its is_scripting() (never, here)
_profiler_enabled = torch.autograd._profiler_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_grad_enabled = torch.is_grad_enabled
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_FAST: dict = {}  # Python body -> its C++ twin (filled by _fastpath once built)
_GATE: list = [None]  # _fastpath's C++ gate(op, impl, *tensors), once built
_PROCESS_ENVIRON = os.environ
_ALWAYS_DISPATCH = [os.environ.get("TESSERA_ALWAYS_DISPATCH", "") == "1"]
