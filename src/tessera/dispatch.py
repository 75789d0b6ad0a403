"""Kernel-or-vendor dispatch of the cpu backend's quantized linears, conv2d and attention (issue #17 item 4).

Each cpu launch of ``linear_w4a16``, ``linear_w4a8``, ``linear_w8a8``, ``linear_a16w8``,
``conv2d`` and bf16 ``attention`` chooses between tessera's own kernel and the *vendor route*,
the same result computed by torch's library calls (oneDNN on this CPU; cuBLAS/cuDNN where torch
runs on a GPU):

* ``linear_w4a16``: the weight dequantized with the op's own ``dequantize_weight`` to x.dtype,
  once per weight tensor (cached, see below), then ``F.linear``; bias and activation in fp32.
* ``linear_w8a8``: x quantized per token by ``contract.quantize_rows`` (the integer contract the
  kernels fuse), ``torch._int_mm`` (exact int32), then the kernel's fp32 epilogue
  ``act(fp32(acc) * (sx * sw) + bias)``.  ``linear_a16w8``: the same with int16 activations and an
  exact float64 product (``|acc| <= K * 2^22 < 2^53``; torch has no int16 GEMM).
* ``linear_w4a8``: x quantized per token to int8, the per-group integer sums
  ``acc_g = qx_g @ (q - z)_g`` as one batched fp32 GEMM over the groups (exact: every partial sum
  is an integer of magnitude <= 128 * 127 * 15 < 2^24), then ``sx * sum_g acc_g * s_g``.
* ``conv2d`` forward: ``F.conv2d`` (asymmetric pads via ``F.pad``) and the activation, the
  result in the kernel's memory format.  Backward: ``aten.convolution_backward`` on
  dz = dy * act'(z), z recomputed in fp32 as the kernels do (silu / gelu: the op masks dy for
  relu / relu6 itself and passes no activation; keys ``conv2d_bwd`` and ``conv2d_dw_bwd``,
  chosen by the same rule as the forward).
* ``attention`` (bf16): CPU SDPA's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``
  and its backward) for the calls it computes exactly as the op defines them
  (``attention_shape``); the forward only when the caller did not ask for lse (its lse is ~6e-5
  off, short of the fp32 rule of a returned lse).  Keys ``attention`` and ``attention_bwd``, with
  M = the sequence length.

The integer recipes keep the integer contract on both routes: the quantized activations and the
integer accumulators are bit-identical, only the float epilogue may round differently (within the
op's tolerance; ``tests/test_dispatch.py``).  The choice is made inside the cpu backend's launcher,
so the custom ops, their fake kernels, opcheck, ``torch.compile`` and export see no change.

Mode: ``TESSERA_DISPATCH`` = ``kernel`` | ``vendor`` | ``auto`` (unset or empty: ``auto``), read at
each launch through ``tessera._env``; any other value raises ``ValueError`` naming the variable.

The ``auto`` rule (cheap per call, deterministic within a process): a launch takes the vendor route
when its GEMM rows ``M`` (a linear's tokens; conv2d's ``N * OH * OW`` output pixels) reach the
threshold of its ``(op, dtype)``, its ``N * K`` (output features times reduction length) is at
least ``LINEAR_NK_MIN`` (dense conv: ``CONV_NK_MIN``; depthwise: no floor), ``M >= MIN_M`` = 16
(decode calls, M = 1, always run the kernel) and, for the int4 linears, the dequantized weight is
cached or fits the cache budget (an uncached dequantization costs more than any GEMM it could
save: about 100 ms for a 2048 x 2048 weight on the 2-core dev VM).  A threshold of ``None``
means "the kernel always wins here".  A pair ``[lo, hi]`` is a band: the vendor route for
``lo <= M < hi`` only (Sapphire Rapids' AMX int8 GEMM behind ``torch._int_mm`` beats the W8A8
kernel at M = 64-128 and loses from 256 on).  A conv2d forward whose x is NCHW (not
channels-last) takes the vendor route in fp32 and bf16 from ``MIN_M`` pixels on, whatever the
table says: the kernels are NHWC, and the layout copies they would need cost more than they save.
A 1x1 conv with at most ``NARROW_COUT`` = 32 output channels asks under its own key,
``conv2d_1x1n`` (narrow), where the table has one: a GEMM that narrow is bound by reading x, where
the kernel stays ahead of oneDNN to a larger M.

The thresholds come from a calibration measured on the machine: ``python -m tessera.dispatch
--calibrate`` times both routes interleaved (best of several rounds, so other processes' load
inflates neither side) for M in 16..512 at N = K = 2048 (conv2d: a 3x3 layer with bias and relu,
64 -> 64 channels at 28x28, batch 1..8, forward and backward, a depthwise 3x3 of 144 channels,
a 1x1 of 256 -> 256 channels at 14x14 and a narrow one of 192 -> 32 at 28x28) and stores, per
(op, dtype), the smallest M from which the
vendor route beats the kernel by at least 5 % at every larger measured M; where it wins only inside the range, at two or
more consecutive measured M, the band ``[first M, next measured M after the last]``.  The result
is cached on disk as
``$TESSERA_CACHE_DIR/dispatch-<machine>.json`` (``tessera._jit.cache_dir``; written under an
exclusive ``fcntl`` lock with an atomic rename; the key hashes the CPU model, the thread count and
torch's version), read once per process.  Without a calibration file a built-in table applies,
chosen by the CPU's vendor (``cpu_vendor``): ``DEFAULTS_INTEL`` on Intel (Sapphire Rapids with
AMX, 2026-12-05, ``benchmarks/results/2026-12-05-cpu-dispatch-intel/``), else ``DEFAULTS`` (the
AMD EPYC dev VM, AVX-512 with BF16/VNNI, no AMX, 2 cores, torch 2.13, remeasured 2026-12-07 in
two calibration runs: ``benchmarks/results/2026-12-07j-cpu-amd/``; first measured 2026-12-04,
``benchmarks/results/2026-12-04-cpu-dispatch/``).  ``DEFAULTS``:

* W4A16 bf16: vendor from M = 32 (oneDNN's AVX512-BF16 GEMM beats the fp32-FMA int4 kernel by
  1.3x at M = 32 and 2.4-2.7x from M = 64; at M = 16 the two are within noise, and at decode the
  kernel reads 4x fewer weight bytes);
* W4A16 fp32: vendor from M = 512 (oneDNN's fp32 GEMM 1.12-1.14x there; level at 256, the kernel
  ahead below); fp16: the kernel (torch's CPU fp16 GEMM is slower);
* W8A8, W4A8, A16W8: the kernel -- the exact vendor routes (``torch._int_mm``; W4A8's batched
  per-group GEMM; A16W8's float64 product) are all slower than the VNNI kernels, W8A8's by
  ~1.2-2.5x, W4A8's by 5-14x, A16W8's by 3x or more;
* conv2d dense: vendor from 3136 output pixels in fp32 (batch 4 of 28 x 28: ~1.1x) and from 784
  in bf16 (oneDNN's bf16 conv ~2x the fp32-accumulating kernel); 1x1 convs: vendor from 3136 in
  fp32 (level to 1568, the calibration's largest), from 196 in bf16 (1.1-2.1x); narrow 1x1 convs
  (``conv2d_1x1n``): the kernel in fp32 (0.5-0.7x oneDNN's time to M = 3136, level at 6272),
  vendor from 1568 in bf16 (1.4-1.9x from 3136); depthwise fp32 and bf16: the kernel (0.3-0.7x
  ``F.conv2d`` + activation's time to 3136 pixels, level at 6272 in fp32); fp16: the kernel
  (``F.conv2d`` in fp16 is several times slower on the AMD VM; on Sapphire Rapids, with
  AVX512-FP16, a calibration file moves large fp16 calls to oneDNN).
  The ``CONV_NK_MIN`` floor keeps few-channel stems (a 3-channel 7x7 conv: the kernel is ~1.8x
  ahead) on the kernel (not bf16 on Intel: ``CONV_NK_MIN_BY_VENDOR``).
* conv2d backward, dense: vendor from M = 16 in fp32 (the kernels' backward ran 0.3-0.6x eager
  autograd on every ResNet-18 / MobileNetV2 bench row; 1.4-1.7x at the calibration layer), from
  784 in bf16 (2.0-3.3x); depthwise: the kernel in fp32 (0.5-0.9x oneDNN's time at every measured
  M), vendor from 3136 in bf16 (1.1-1.2x); fp16: the kernel (``aten.convolution_backward`` in
  fp16 is ~100x slower on Intel).

``DEFAULTS_INTEL`` differs where oneDNN's AMX and AVX512-FP16 paths change the winner:

* W4A16: vendor from M = 16 (bf16, AMX: 2.3-6.6x), 32 (fp16), 64 (fp32: 1.15-1.36x);
* W8A8: the kernel (2026-12-06, once its broadcast GEMM ran on AMX tiles from M = 40: it takes
  0.46-0.93x the time of ``torch._int_mm``'s route from M = 32 to 256 at N = K = 2048, 0.45-0.82x
  from 128 to 512 at 4096, but 1.13-1.32x in fp32 at M = 48-64, K = 4096, a case one M range
  per dtype cannot single out; ``benchmarks/results/2026-12-06c-cpu-int8-amx/``; before, vendor
  for 64 <= M < 256);
* dense conv2d fp32 and bf16, forward and backward: vendor from M = 16.  The calibration layer
  (64 channels at 28 x 28) is the kernel's best case (fp32 forward level to 3136 pixels), but the
  measured ResNet-18 layers at 256 and 512 channels run 1.5-3.2x faster on oneDNN in fp32 and
  2-10x in bf16 (AMX); the kernel keeps only few-channel layers below ``CONV_NK_MIN``;
* depthwise forward, every dtype: the kernel (bf16 / fp16 since it reads a half-precision x in
  place, 2026-12-06); depthwise backward: the kernel (2026-12-06).

Dequantized-weight cache: the int4 routes keep one dequantized copy per weight tensor (like
conv2d's packed weights: valid while the tensor lives and its version counter, address and
strides are unchanged, and so are the scale and zero tensors), up to ``CACHE_BYTES`` in all
(default 2 GiB); weights past the budget are not cached, and ``auto`` then keeps them on the
kernel, as it does a weight rebuilt more than ``MAX_REBUILDS`` times (a caller handing in new
scale tensors on every call).  Inference-mode weights and fenced test
runs are never cached.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import platform
import tempfile
import time
import weakref

import torch
import torch.nn.functional as F

from . import _env

ENV = "TESSERA_DISPATCH"
MODES = ("kernel", "vendor", "auto")
MIN_M = 16                       # auto never takes the vendor route below this many rows
# a 1x1 conv with at most this many output channels asks the table under "conv2d_1x1n" (narrow)
# where the table has that key, else under "conv2d_1x1": in fp32 on Sapphire Rapids the kernel
# keeps winning such layers to ~4x the M at which oneDNN takes the wider ones
NARROW_COUT = 32
CACHE_BYTES = 2 << 30            # budget of the dequantized-weight cache
LINEAR_NK_MIN = 1 << 18          # N * K of a linear below which auto keeps the kernel
CONV_NK_MIN = 1 << 14            # C_out * C_in/g * KH * KW of a dense conv below which auto keeps the kernel
# ... except where a CPU vendor's oneDNN wins below it too: on Sapphire Rapids a bf16 conv runs on
# AMX, 1.15-5.1x the kernel at every few-channel shape measured (ResNet-18's 3-channel stem 2.6x at
# batch 1, 3.0x at 8; MobileNetV2's 1x1 convs of 16-144 channels 1.4-5.1x; 1 thread, 2026-12-05)
# (fp32 too, remeasured 2026-12-06 at 2 threads: the 3-channel 7x7 stem 1.25-1.37x, MobileNetV2's
# 16->96 / 24->144 expansions 2.0x, ResNet's 64->128 strided 1x1 1.4-2.8x; pointwise-conv rows:
# benchmarks/results/2026-12-06-cpu-conv2d-pointwise/)
CONV_NK_MIN_BY_VENDOR = {"GenuineIntel": {torch.bfloat16: 0, torch.float32: 0}}
# conv2d forward on NCHW x: tessera's CPU conv kernels are NHWC, so NCHW x costs a layout copy in
# and strided stores out (1.5-3x F.conv2d on NCHW MobileNetV2 layers, Sapphire Rapids, fp32), while
# oneDNN runs NCHW natively; fp16 stays on the kernel (F.conv2d's fp16 path is slow on AVX-512 CPUs
# without FP16 and its backward everywhere).
NCHW_VENDOR_DTYPES = (torch.float32, torch.bfloat16)
MARGIN = 0.05                    # calibration: the vendor route must win by this fraction

# (op, dtype name) -> smallest M taking the vendor route under auto, or None (always the kernel).
# op "conv2d" is a dense conv, "conv2d_1x1" a dense 1x1 (pointwise) one, "conv2d_dw" a depthwise
# one, "*_bwd" their backward (a 1x1 backward is a "conv2d_bwd").  One table
# per CPU vendor (module docstring): oneDNN's relative speed differs more between them than
# between sizes.  DEFAULTS (AMD EPYC, AVX-512 BF16/VNNI, no AMX) also serves other CPUs.
DEFAULTS: dict[str, int | list | None] = {
    "linear_w4a16:float32": 512, "linear_w4a16:bfloat16": 32, "linear_w4a16:float16": None,
    "linear_w4a8:float32": None, "linear_w4a8:bfloat16": None, "linear_w4a8:float16": None,
    "linear_w8a8:float32": None, "linear_w8a8:bfloat16": None, "linear_w8a8:float16": None,
    "linear_a16w8:float32": None, "linear_a16w8:bfloat16": None, "linear_a16w8:float16": None,
    "conv2d:float32": 3136, "conv2d:bfloat16": 784, "conv2d:float16": None,
    "conv2d_1x1:float32": 3136, "conv2d_1x1:bfloat16": 196, "conv2d_1x1:float16": None,
    "conv2d_1x1n:float32": None, "conv2d_1x1n:bfloat16": 1568, "conv2d_1x1n:float16": None,
    "conv2d_dw:float32": None, "conv2d_dw:bfloat16": None, "conv2d_dw:float16": None,
    "conv2d_bwd:float32": 16, "conv2d_bwd:bfloat16": 784, "conv2d_bwd:float16": None,
    "conv2d_dw_bwd:float32": None, "conv2d_dw_bwd:bfloat16": 3136, "conv2d_dw_bwd:float16": None,
    # attention (M = the sequence length; only calls SDPA can express, see attention_shape): not
    # measured on this CPU, so the kernel
    "attention:float32": None, "attention:bfloat16": None, "attention:float16": None,
    "attention_bwd:float32": None, "attention_bwd:bfloat16": None, "attention_bwd:float16": None,
}
# Intel Sapphire Rapids (AVX-512 FP16/BF16/VNNI, AMX), 2 cores, torch 2.13, 2026-12-05:
# benchmarks/results/2026-12-05-cpu-dispatch-intel/.
DEFAULTS_INTEL: dict[str, int | list | None] = dict(DEFAULTS, **{
    "linear_w4a16:float32": 64, "linear_w4a16:bfloat16": 16, "linear_w4a16:float16": 32,
    "conv2d:float32": 16, "conv2d:bfloat16": 16, "conv2d:float16": None,
    # 1x1 convs (GEMMs over channels): in fp32 the kernel wins the small-M ones (960->160 at 7x7
    # 0.56x oneDNN's time, 64->384 at 14x14 0.82x) and oneDNN from M = 784 (1.4-2.8x); AMX bf16 wins all
    "conv2d_1x1:float32": 784, "conv2d_1x1:bfloat16": 16, "conv2d_1x1:float16": None,
    # narrow 1x1 convs (<= NARROW_COUT outputs), fp32: the kernel takes 0.45-0.86x oneDNN's time up to
    # M = 3136 (144->24, 96->24, 144->32, 192->32) and 1.09-1.10x at 12544; 40 and 48 outputs gain
    # nothing past M = 784 (240->40 1.26x at 3136, 576->48 1.15x at 784)
    # (benchmarks/results/2026-12-06g-cpu-conv2d-int8-fastpath/narrow_routes.txt)
    "conv2d_1x1n:float32": 6272, "conv2d_1x1n:bfloat16": 16, "conv2d_1x1n:float16": None,
    # depthwise forward, remeasured 2026-12-06 once the kernel read a bf16 / fp16 channels-last x in
    # place: the kernel takes 0.44-0.86x oneDNN's time (F.conv2d + relu6) at every MobileNetV2 layer,
    # batch 1 and 8, both dtypes (benchmarks/results/2026-12-06b-cpu-conv2d-dw-half/)
    "conv2d_dw:float32": None, "conv2d_dw:bfloat16": None, "conv2d_dw:float16": None,
    "conv2d_bwd:float32": 16, "conv2d_bwd:bfloat16": 16, "conv2d_bwd:float16": None,
    # depthwise backward, remeasured 2026-12-06 after the row-parallel weight gradient and the
    # in-place (virtually padded) reads of x and dz: the kernel takes 0.35-0.84x oneDNN's time on
    # MobileNetV2's layers in fp32 (1.02-1.08x at 8x144x56x56 and the stride-2 layer); in bf16
    # 0.53-1.04x up to M = 12544 and 1.48x at 8x144x56x56, but oneDNN's strided bf16 depthwise
    # backward takes 5.8x the kernel's time (benchmarks/results/2026-12-06-cpu-conv2d-dw-bwd/)
    "conv2d_dw_bwd:float32": None, "conv2d_dw_bwd:bfloat16": None, "conv2d_dw_bwd:float16": None,
    # bf16 attention, 2026-12-06 (benchmarks/results/2026-12-06-cpu-attention-vendor/): SDPA's AMX
    # flash forward takes 0.24-0.63x the kernel's time at every length from 64; its backward
    # 0.38-0.69x from 1024, but up to 4.8x the kernel's time below (at 64 tokens)
    "attention:bfloat16": 16, "attention_bwd:bfloat16": 1024,
})


@functools.lru_cache(maxsize=None)
def cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ('GenuineIntel', 'AuthenticAMD', ...; '' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("vendor_id")), "")
    except OSError:
        return ""


def defaults() -> dict:
    """The built-in table of this CPU's vendor (used where no calibration file exists)."""
    return DEFAULTS_INTEL if cpu_vendor() == "GenuineIntel" else DEFAULTS


_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

counts: dict[tuple[str, str], int] = {}  # (op, "kernel" | "vendor") -> launches in this process


def mode() -> str:
    """The ``TESSERA_DISPATCH`` mode of this launch (read now): 'kernel', 'vendor' or 'auto'."""
    m = _env.get(ENV, "")
    if not m:
        return "auto"
    if m not in MODES:
        raise ValueError(f"{ENV}={m!r} is not a dispatch mode: expected 'kernel', 'vendor' or 'auto' "
                         f"(unset means 'auto')")
    return m


@contextlib.contextmanager
def forced(m: str):
    """Run the block with ``TESSERA_DISPATCH=m`` (benchmarks, calibration)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = m
    try:
        mode()
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


# ---------------------------------------------------------------- the rule

def machine_key() -> str:
    """What a calibration depends on: CPU model, threads, torch version."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    raw = f"{model}|{os.cpu_count()}|{torch.get_num_threads()}|{torch.__version__}|{platform.machine()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def calibration_path():
    from ._jit import cache_dir
    return cache_dir() / f"dispatch-{machine_key()}.json"


@functools.lru_cache(maxsize=None)
def thresholds() -> dict:
    """The auto rule's thresholds of this process: the machine's calibration file when there is
    one, else ``DEFAULTS`` (read once: the rule stays fixed while the process runs)."""
    rules = dict(defaults())
    try:
        data = json.loads(calibration_path().read_text())
        rules.update({k: v for k, v in data.get("thresholds", {}).items() if k in DEFAULTS})
    except (OSError, ValueError, AttributeError):
        pass
    return rules


def route(op: str, dtype: torch.dtype, M: int, N: int, K: int, cache_ok=None, nchw=False) -> str:
    """'kernel' or 'vendor' for one launch: the forced mode, or the auto rule (module docstring).
    ``cache_ok``: None, or a no-argument callable saying whether the vendor route would find (or
    may store) its dequantized weight, asked last (decode calls never pay for it).  ``nchw``: a
    conv2d forward on NCHW x, which auto sends to the vendor in fp32 / bf16 whatever the table says."""
    m = mode()
    if m != "auto":
        return m
    if M < MIN_M:
        return "kernel"
    if nchw and dtype in NCHW_VENDOR_DTYPES:
        return "vendor"
    table = thresholds()
    key = f"{op}:{_DT.get(dtype, dtype)}"
    if op == "conv2d_1x1" and N <= NARROW_COUT and f"conv2d_1x1n:{_DT.get(dtype, dtype)}" in table:
        key = f"conv2d_1x1n:{_DT.get(dtype, dtype)}"
    thr = table.get(key)
    nk_min = conv_nk_min(dtype) if op in ("conv2d", "conv2d_1x1") else 0 \
        if op.startswith(("conv2d", "attention")) else LINEAR_NK_MIN
    if isinstance(thr, (list, tuple)):   # a band [lo, hi)
        thr, hi = thr
        if M >= hi:
            return "kernel"
    if thr is None or M < thr or N * K < nk_min:
        return "kernel"
    return "vendor" if cache_ok is None or cache_ok() else "kernel"


def conv_nk_min(dtype: torch.dtype) -> int:
    """The NK floor of a dense conv forward under auto on this CPU (``CONV_NK_MIN`` unless its
    vendor's entry in ``CONV_NK_MIN_BY_VENDOR`` says otherwise)."""
    return CONV_NK_MIN_BY_VENDOR.get(cpu_vendor(), {}).get(dtype, CONV_NK_MIN)


def use_vendor(op: str, dtype: torch.dtype, M: int, N: int, K: int, cache_ok=None, nchw=False) -> bool:
    """:func:`route` == 'vendor', counted in ``counts``."""
    if M < MIN_M and _env.get(ENV, "") in ("", "auto"):  # decode under auto: the cheapest path
        key = (op, "kernel")
        counts[key] = counts.get(key, 0) + 1
        return False
    r = route(op, dtype, M, N, K, cache_ok, nchw)
    key = (op, r)
    counts[key] = counts.get(key, 0) + 1
    return r == "vendor"


# ---------------------------------------------------------------- dequantized-weight cache

_CACHE: dict = {}   # (kind, id(weight), dtype) -> (weakrefs, stamp, tensor, nbytes)
_USED = [0]
_REBUILDS: dict = {}  # (kind, id(weight), dtype) -> times rebuilt for a live weight
MAX_REBUILDS = 2      # past this, auto keeps that weight on the kernel (its scales change every call)


def _stamp(*ts):
    return tuple((None if t is None else (t._version, t.data_ptr(), t.stride(), tuple(t.shape))) for t in ts)


def _refs(*ts):
    return tuple(None if t is None else weakref.ref(t) for t in ts)


def _same(refs, ts):
    return all((r is None and t is None) or (r is not None and r() is t) for r, t in zip(refs, ts))


def _cacheable(weight) -> bool:
    from . import _library
    return _library._PLACE[0] is None and not weight.is_inference()


def _drop(key):
    ent = _CACHE.pop(key, None)
    if ent is not None:
        _USED[0] -= ent[3]


def _forget(key):
    _drop(key)
    _REBUILDS.pop(key, None)


def cache_ok(kind: str, weight, dtype, nbytes: int) -> bool:
    """Would the vendor route of this weight find its dequantized copy cached, or may it store one?
    (Not when its scales or zeros came as new tensors on every call: each would rebuild it.)"""
    if not _cacheable(weight):
        return False
    key = (kind, id(weight), dtype)
    if _REBUILDS.get(key, 0) > MAX_REBUILDS:
        return False
    return key in _CACHE or _USED[0] + nbytes <= CACHE_BYTES


def cached(kind: str, weight, dtype, build, others=()):
    """``build()`` memoised per (kind, weight tensor, dtype) while the weight and ``others``
    (scales, zeros) are the same tensors, unchanged (version counter, address, strides); stored
    only within ``CACHE_BYTES``."""
    if not _cacheable(weight) or any(o is not None and o.is_inference() for o in others):
        return build()
    key = (kind, id(weight), dtype)
    ts = (weight, *others)
    stamp = _stamp(*ts)
    ent = _CACHE.get(key)
    if ent is not None:
        if _same(ent[0], ts) and ent[1] == stamp:
            return ent[2]
        if ent[0][0]() is weight:
            _REBUILDS[key] = _REBUILDS.get(key, 0) + 1
    _drop(key)
    out = build()
    nbytes = out.numel() * out.element_size()
    if _USED[0] + nbytes <= CACHE_BYTES:
        refs = (weakref.ref(weight, lambda _r, k=key: _forget(k)),) + _refs(*others)
        _CACHE[key] = (refs, stamp, out, nbytes)
        _USED[0] += nbytes
    return out


def clear_cache() -> None:
    for key in list(_CACHE):
        _drop(key)
    _REBUILDS.clear()


# ---------------------------------------------------------------- vendor routes

def _epilogue(y, bias, activation, dtype):
    """act(y + bias) in fp32 (the kernels' epilogue), rounded once to dtype."""
    from .ops._qlinear_int8.ref import activate
    if bias is None and activation is None:
        return y.to(dtype)
    y = y.float()
    if bias is not None:
        y = y + bias.float()
    return activate(y, activation).to(dtype)


def int4_bytes(weight, dtype) -> int:
    return weight.shape[0] * weight.shape[1] * 2 * torch.empty((), dtype=dtype).element_size()


def w4a16(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    """x [M, K] row view -> y [M, N] in x.dtype: F.linear with the cached dequantized weight."""
    from .ops._qlinear_int4 import dequantize_weight
    w = cached("w4a16", weight, x.dtype,
               lambda: dequantize_weight(weight, weight_scale, weight_zero, group_size, x.dtype),
               (weight_scale, weight_zero))
    return _epilogue(F.linear(x, w), bias, activation, x.dtype)


def w4a8(x, weight, weight_scale, weight_zero, group_size, bias, activation):
    """Exact per-group int8 x int4 sums as a batched fp32 GEMM, then ``sx * sum_g acc_g * s_g``."""
    from .ops._qlinear_int4 import unpack_int4
    from .quant import contract
    M, K = x.shape
    N, G, g = weight.shape[0], K // group_size, group_size

    def build():  # (q - z) as fp32 [G, g, N]: exact small integers
        q = unpack_int4(weight).float()
        z = 8.0 if weight_zero is None else weight_zero.float().repeat_interleave(g, 1)
        return (q - z).reshape(N, G, g).permute(1, 2, 0).contiguous()

    wz = cached("w4a8", weight, torch.float32, build, (weight_zero,))
    qx, sx = contract.quantize_rows(x, torch.int8)
    st = weight_scale.float().t()[:, None, :]                         # [G, 1, N]
    y = torch.empty(M, N, dtype=torch.float32)
    step = max(1, (16 << 20) // max(1, G * N))                        # <= 64 MiB of accumulators
    for m0 in range(0, M, step):
        q = qx[m0:m0 + step].float()
        acc = torch.bmm(q.reshape(-1, G, g).transpose(0, 1), wz)      # [G, m, N], exact integers
        y[m0:m0 + step] = (acc * st).sum(0) * sx[m0:m0 + step, None]
    return _epilogue(y, bias, activation, x.dtype)


def int8_linear(x, weight, sw, bias, activation, bits):
    """W8A8 (bits 8: torch._int_mm) / A16W8 (bits 16: exact float64 product), fp32 epilogue
    ``act(fp32(acc) * (sx * sw) + bias)`` as the kernels."""
    from .quant import contract
    from .ops._qlinear_int8.ref import QTYPE, activate
    qx, sx = contract.quantize_rows(x, QTYPE[bits])
    if bits == 8:
        acc = torch._int_mm(qx, weight.t()).float()
    else:
        acc = (qx.double() @ weight.double().t()).float()
    y = acc * (sx[:, None] * sw.float()[None, :])
    if bias is not None:
        y = y + bias.float()
    return activate(y, activation).to(x.dtype)


def _in_kernel_layout(t, channels_last: bool) -> bool:
    """Does ``t`` (N, C, H, W) have the strides of the kernels' output (``ops.conv2d.cpu._out``:
    channels-last or contiguous), so a vendor result can be returned without a copy?"""
    n, c, h, w = t.shape
    return t.stride() == ((h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1))


def conv2d(x, weight, bias, stride, pads, dilation, groups, activation, out_like, channels_last):
    """F.conv2d + activation (relu / relu6 in place on the result, exact; silu / gelu in fp32,
    rounded once); returned in the layout of ``out_like(shape)`` (the kernel's: channels-last
    strides when ``channels_last``, else contiguous)."""
    from .ops.conv2d.ref import act_fwd
    t, b, l, r = pads
    if t == b and l == r:
        y = F.conv2d(x, weight, bias, stride, (t, l), dilation, groups)
    else:
        y = F.conv2d(F.pad(x, (l, r, t, b)), weight, bias, stride, 0, dilation, groups)
    if activation in ("relu", "relu6"):  # exact on the rounded sum: in place, no fp32 pass
        y = y.relu_() if activation == "relu" else y.clamp_(0.0, 6.0)
    elif activation is not None:
        y = act_fwd(y.float(), activation).to(x.dtype)
    if _in_kernel_layout(y, channels_last):
        return y             # already in the kernel's layout (x's): no copy
    out = out_like(tuple(y.shape))
    out.copy_(y)
    return out


def conv2d_backward(dy, x, weight, bias, stride, pads, dilation, groups, activation, need_bias, out_like,
                    channels_last):
    """(dx, dweight, dbias) by ``aten.convolution_backward`` (oneDNN): dz = dy * act'(z) with the
    pre-activation z recomputed in fp32 (as the kernels do), dz rounded to x's dtype for the
    library call; dweight and dbias come back in the library's dtype (the weight's: the op casts
    to it, a no-op here), dx in the layout of ``out_like(shape)``."""
    from .ops.conv2d.ref import act_grad
    N, C, H, W = x.shape
    t, b, l, r = pads
    sym = t == b and l == r
    xin = x if sym else F.pad(x, (l, r, t, b))
    padding = (t, l) if sym else (0, 0)
    dz = dy
    if activation is not None:
        z = F.conv2d(xin.float(), weight.float(), None if bias is None else bias.float(), stride, padding,
                     dilation, groups)
        if activation in ("relu", "relu6"):
            # aten's own masks (one fused pass; building the 0/1 mask in torch ops cost 1.2 ms at
            # 32x112x112, 6x this); dy's values pass unchanged or become 0, so fp32 is exact
            g = dy.float()
            g = (torch.ops.aten.threshold_backward(g, z, 0.0) if activation == "relu"
                 else torch.ops.aten.hardtanh_backward(g, z, 0.0, 6.0))
            dz = g.to(x.dtype)
        else:
            dz = (dy.float() * act_grad(z, activation)).to(x.dtype)
    dx, dw, db = torch.ops.aten.convolution_backward(
        dz, xin, weight, [weight.shape[0]] if need_bias else None, list(stride), list(padding), list(dilation),
        False, [0, 0], groups, [True, True, need_bias])
    if not sym:
        dx = dx[:, :, t:t + H, l:l + W]
    if sym and dx.dtype == x.dtype and _in_kernel_layout(dx, channels_last):
        return dx, dw, (db if need_bias else None)    # already in the kernel's layout: no copy
    out = out_like((N, C, H, W))
    out.copy_(dx)
    return out, dw, (db if need_bias else None)


def attention_shape(q, k, cu_q, cu_k, max_q, max_k, window_left, window_right, softcap):
    """(B, Lq, Lk, causal) where torch's SDPA computes this packed attention call as the op defines
    it: every sequence full length (cu = 0, L, 2L, ...), Lk >= 2, no softcap, and no window other
    than causal with Lq == Lk (SDPA's causal mask is top-left aligned, the op's bottom-right); else
    None.  (With one key dq is exactly 0, where SDPA's backward leaves rounding noise.)"""
    B = cu_q.shape[0] - 1
    Tq, Tk = q.shape[0], k.shape[0]
    if softcap or B < 1 or window_left != -1 or max_q is None or max_k is None or max_q * B != Tq \
            or max_k * B != Tk or max_q < 1 or max_k < 2:
        return None
    causal = window_right == 0
    if not (window_right == -1 or (causal and max_q == max_k)):
        return None
    if not (torch.equal(cu_q, torch.arange(0, Tq + 1, max_q, dtype=cu_q.dtype, device=cu_q.device))
            and torch.equal(cu_k, torch.arange(0, Tk + 1, max_k, dtype=cu_k.dtype, device=cu_k.device))):
        return None
    return B, max_q, max_k, causal


def _bhld(t, B, L):
    """packed (B*L, H, D) -> (B, H, L, D), a view"""
    return t.unflatten(0, (B, L)).transpose(1, 2)


def attention(q, k, v, shape, scale):
    """(out (Tq, Hq, D), lse (Hq, Tq) fp32) by CPU SDPA's flash kernel (AMX bf16 on Sapphire
    Rapids).  Its logsumexp is the op's (natural log, scale included) to ~6e-5, short of the fp32
    rule the op holds a returned lse to: only for calls whose lse feeds the backward alone."""
    B, Lq, Lk, causal = shape
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _bhld(q, B, Lq), _bhld(k, B, Lk), _bhld(v, B, Lk), 0.0, causal, attn_mask=None, scale=scale)
    Hq, D = q.shape[1], q.shape[2]
    return o.transpose(1, 2).reshape(B * Lq, Hq, D), lse.transpose(0, 1).reshape(Hq, B * Lq)


def attention_backward(dout, q, k, v, out, lse, shape, scale):
    """(dq, dk, dv) by CPU SDPA's flash backward, packed (T, H, D) like the kernel's."""
    B, Lq, Lk, causal = shape
    lse4 = lse.view(lse.shape[0], B, Lq).transpose(0, 1).contiguous()
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _bhld(dout, B, Lq), _bhld(q, B, Lq), _bhld(k, B, Lk), _bhld(v, B, Lk), _bhld(out, B, Lq), lse4, 0.0,
        causal, attn_mask=None, scale=scale)
    return tuple(g.transpose(1, 2).reshape(B * L, g.shape[1], g.shape[3])
                 for g, L in ((dq, Lq), (dk, Lk), (dv, Lk)))


# ---------------------------------------------------------------- calibration

def _best(fn, rounds):
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _time_pair(call, rounds=5):
    """(kernel s, vendor s): best of ``rounds`` interleaved rounds of each route."""
    k = v = float("inf")
    for _ in range(rounds):
        with forced("kernel"):
            k = min(k, _best(call, 1))
        with forced("vendor"):
            v = min(v, _best(call, 1))
    return k, v


def _linear_calls(op, dtype, M, N, K, gen):
    import tessera
    from .ops._qlinear_int4 import quantize_weight
    from .quant import contract
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = torch.randn(N, K, generator=gen)
    if op in ("linear_w4a16", "linear_w4a8"):
        qw, s, _ = quantize_weight(w, 128, False)
        fn = getattr(tessera, op)
        return lambda: fn(x, qw, s, None, 128)
    q, s = contract.quantize_rows(w, torch.int8)
    fn = getattr(tessera, op)
    return lambda: fn(x, q, s)


# the calibration layer of each conv key: (channels, spatial size, kernel size); batch 1, 2, 4, 8
_CONV_LAYER = {"conv2d": (64, 28, 3), "conv2d_dw": (144, 28, 3), "conv2d_1x1": (256, 14, 1),
               "conv2d_1x1n": (192, 28, 1, 32), "conv2d_bwd": (64, 28, 3), "conv2d_dw_bwd": (144, 28, 3)}


def _conv_call(op, dtype, batch, gen):
    """The calibration layer of ``op`` (``_CONV_LAYER``: bias and relu, channels-last, C -> C, or
    C -> the fourth field); the forward op, or for the ``*_bwd`` keys the cpu backward."""
    import tessera
    from .ops.conv2d import cpu
    C, H, k, *out = _CONV_LAYER[op]
    O = out[0] if out else C
    g = C if op.startswith("conv2d_dw") else 1
    x = torch.randn(batch, C, H, H, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    w = (torch.randn(O, C // g, k, k, generator=gen) * 0.1).to(dtype)
    b = torch.randn(O, generator=gen).to(dtype)
    if op.endswith("_bwd"):
        dy = torch.randn(batch, C, H, H, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
        # activation None: the op hands relu's backward to the backends as a masked dy (ops/conv2d)
        return lambda: cpu.backward(dy, x, w, b, (1, 1), (k // 2,) * 4, (1, 1), g, None, True)
    return lambda: tessera.conv2d(x, w, b, padding=k // 2, groups=g, activation="relu")


def _threshold(points):
    """points [(M, kernel s, vendor s)] ascending M -> smallest M from which vendor wins by MARGIN,
    else the band [lo, hi) of the longest run (two points or more) where it does, else None."""
    wins = [v < (1 - MARGIN) * k for _, k, v in points]
    thr = None
    for (M, _, _), w in zip(reversed(points), reversed(wins)):
        if not w:
            break
        thr = M
    if thr is not None:
        return thr
    best, i = None, 0
    while i < len(points):
        j = i
        while j < len(points) and wins[j]:
            j += 1
        if j - i >= 2 and (best is None or j - i > best[1] - best[0]):
            best = (i, j)   # j < len(points): a run reaching the end returned above
        i = j + 1
    return None if best is None else [points[best[0]][0], points[best[1]][0]]


def calibrate(ms=(16, 32, 64, 128, 256, 512), n=2048, k=2048, dtypes=(torch.float32, torch.bfloat16),
              ops=("linear_w4a16", "linear_w4a8", "linear_w8a8", "linear_a16w8", "conv2d", "conv2d_1x1",
                   "conv2d_1x1n", "conv2d_dw", "conv2d_bwd", "conv2d_dw_bwd"),
              rounds=5, write=True, log=print) -> dict:
    """Measure both routes on this machine and (``write``) store the thresholds (module docstring).
    Returns {"thresholds": {...}, "points": {key: [[M, kernel_ms, vendor_ms], ...]}}."""
    gen = torch.Generator().manual_seed(0)
    found, points = {}, {}
    for op in ops:
        for dt in dtypes:
            key = f"{op}:{_DT[dt]}"
            pts = []
            if op.startswith("conv2d"):
                H = _CONV_LAYER[op][1]
                for batch in (1, 2, 4, 8):
                    kt, vt = _time_pair(_conv_call(op, dt, batch, gen), rounds)
                    pts.append((batch * H * H, kt, vt))
            else:
                for M in ms:
                    kt, vt = _time_pair(_linear_calls(op, dt, M, n, k, gen), rounds)
                    pts.append((M, kt, vt))
            found[key] = _threshold(pts)
            points[key] = [[M, round(kt * 1e3, 3), round(vt * 1e3, 3)] for M, kt, vt in pts]
            if log:
                log(f"{key:24s} threshold {found[key]}  " +
                    "  ".join(f"M={M}: {a:.2f}/{b:.2f} ms" for M, a, b in points[key]))
    result = {"machine": machine_key(), "thresholds": found, "points": points,
              "shape": {"n": n, "k": k}, "torch": torch.__version__}
    if write:
        _write(result)
        thresholds.cache_clear()
    return result


def _write(result) -> None:
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        try:
            fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, path)  # atomic: readers never see a partial file
        finally:
            fcntl.flock(lockf, fcntl.LOCK_UN)


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m tessera.dispatch", description=__doc__.splitlines()[0])
    p.add_argument("--calibrate", action="store_true", help="measure this machine and store the thresholds")
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    if a.calibrate:
        calibrate(n=a.n, k=a.k, rounds=a.rounds)
        print(f"written {calibration_path()}")
    else:
        print(f"mode {mode()}; thresholds ({'calibrated' if calibration_path().exists() else 'defaults'}):")
        for key, v in thresholds().items():
            print(f"  {key:24s} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
