"""The one tolerance rule every float comparison in tessera uses (``shared/notes/numerics.md``).

* fp32: elementwise ``|out - ref64| <= atol + rtol * |ref64|`` with
  ``torch.testing.assert_close``'s fp32 defaults (rtol 1.3e-6, atol 1e-5), loosened
  only through an op spec's written override.
  The hypothesis fuzz alone also passes the fp32 eager baseline: its random draws can be
  arbitrarily ill-conditioned (layer_norm's gradient over a row of 2 nearly equal values: plain
  torch fp32 is off by 3.5e-3 there), so an fp32 element passes under either the defaults or the
  low-precision rule below applied in fp32 (min(2 x torch-fp32 error, cap) + 1 ulp).  The
  matrix's fixed cases and the planted-bug tests keep the strict defaults.
* fp16 / bf16, elementwise at every position i where the reference is finite::

      |out_i - ref64_i| <= min(2 * E, cap) + eps * |ref64_i| + tiny
      E   = max_j |ref_lp_j - ref64_j|        over positions j where ref_lp_j is finite
      cap = max(CAP_REL * S, ZERO_LEVEL),   S = max_j |ref64_j|

  ``ref_lp`` is the op's ``eager`` baseline: plain PyTorch in the same dtype, written the
  way a user writes it (``F.rms_norm``, ``F.layer_norm``, ``torch.softmax``: PyTorch's own
  fp32 statistics; the quantized linears quantize activations exactly as the kernels
  do).  ``2 * E`` is FlashAttention's rule: at most twice the error of plain PyTorch.
  ``eps * |ref64_i| + tiny`` (``torch.finfo(dtype)``) is a floor of about one ulp of each
  element's own value, so an element-exact eager does not demand more than rounding.
  ``cap`` is why the rule still means something where the baseline is broken: an eager
  formula that overflows (squares of fp16 values near 65504 give ``inf``, its output
  zeros) has an error as large as the output itself, and ``2 * E`` alone would then
  admit an all-zero kernel output.  The eager term never exceeds ``CAP_REL = 1/8`` of
  the tensor's largest reference value, so an output that is wrong by its own magnitude
  (zeros, halves, sign flips) fails at the largest element whatever the baseline did.
  The cap is a fixed fraction, not a number of eps: ill-conditioned cases amplify
  rounding (fp16 attention on +-1e4 logits: the cpu kernel's error is 0.0085 S, 9 eps),
  and the largest error of any kernel in the fp16/bf16 matrix (cpu and interpreted
  Triton, outputs and gradients, large cases included) is 0.084 of its cap (Triton geglu
  bf16: 0.0104 S).
  ``ZERO_LEVEL = 2^-24`` (fp16's smallest subnormal) is the absolute level under which
  the cap stops shrinking: a reference whose largest value is that small (attention
  gradients of ~1e-15 under saturated softmax rows) is zero at the O(1) scale of the
  cases, and there eager's fp32-rounding noise still counts.
  Positions where eager is NaN/inf but the reference is finite (an ``-inf``-masked
  softmax row, an overflowing eager formula) contribute nothing to ``E``: the bound
  never becomes infinite through them.
* Integer and quantized-format outputs (the reference returns int/fp8 tensors): bit-exact.
* Non-finite values must sit at the same positions as in the reference cast to the
  output dtype (overflow to inf counts), with the same sign for inf; a NaN the
  reference does not have always fails.
"""
from __future__ import annotations

import dataclasses

import torch

FP32_RTOL, FP32_ATOL = 1.3e-6, 1e-5
CAP_REL = 1.0 / 8         # the eager allowance is capped at CAP_REL * max|ref| ...
ZERO_LEVEL = 2.0 ** -24   # ... but never below this absolute level (a ~zero reference)


@dataclasses.dataclass
class Verdict:
    ok: bool
    err: float          # max abs error over finite positions
    bound: float        # what it had to be under (fp32: reported as max allowed excess)
    why: str = ""


def nmse(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    den = float((b * b).sum())
    return float(((a - b) ** 2).sum()) / den if den > 0 else float(((a - b) ** 2).sum())


def exact_dtype(dt: torch.dtype) -> bool:
    """Integer and 1-byte float (fp8) tensors are quantized formats: compared bit for bit."""
    return not dt.is_floating_point or dt.itemsize == 1


def compare_exact(out: torch.Tensor, ref: torch.Tensor) -> Verdict:
    if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
        return Verdict(False, float("inf"), 0.0, f"got {tuple(out.shape)} {out.dtype}, reference "
                       f"{tuple(ref.shape)} {ref.dtype}")
    o, r = out.detach().cpu(), ref.detach().cpu()
    if o.dtype.is_floating_point:  # fp8: compare the bit patterns (NaN == NaN, -0 != +0)
        o, r = o.view(torch.uint8), r.view(torch.uint8)
    if torch.equal(o, r):
        return Verdict(True, 0.0, 0.0)
    n = int((o != r).sum())
    return Verdict(False, float("inf"), 0.0, f"{n} of {o.numel()} elements differ from the reference; "
                   "quantized/integer outputs must be bit-exact")


def compare(out: torch.Tensor, ref64: torch.Tensor, ref_lp: torch.Tensor | None, dtype: torch.dtype,
            tol: tuple[float, float] | None = None) -> Verdict:
    """``ref64`` in float64 is judged by the float rules for ``dtype``; a reference of an
    integer/fp8 dtype (a quantized output) must be matched exactly, in that dtype."""
    if exact_dtype(ref64.dtype):
        return compare_exact(out, ref64)
    if tuple(out.shape) != tuple(ref64.shape):
        return Verdict(False, float("inf"), 0.0, f"shape {tuple(out.shape)} != reference {tuple(ref64.shape)}")
    if out.dtype != dtype:
        return Verdict(False, float("inf"), 0.0, f"dtype {out.dtype} != expected {dtype}")
    if out.numel() == 0:
        return Verdict(True, 0.0, 0.0)
    o = out.detach().double().cpu()
    r = ref64.detach().double().cpu()
    r_cast = r.to(dtype).double()  # where the exact result overflows the dtype, inf is right
    bad_o, bad_r = ~torch.isfinite(o), ~torch.isfinite(r_cast)
    if not torch.equal(bad_o, bad_r):
        n_extra = int((bad_o & ~bad_r).sum())
        n_missing = int((bad_r & ~bad_o).sum())
        return Verdict(False, float("inf"), 0.0,
                       f"non-finite mismatch: {n_extra} unexpected NaN/Inf, {n_missing} missing")
    if bad_o.any():
        same = (o[bad_o] == r_cast[bad_o]) | (torch.isnan(o[bad_o]) & torch.isnan(r_cast[bad_o]))
        if not bool(same.all()):
            return Verdict(False, float("inf"), 0.0, "inf of the wrong sign or NaN where inf expected")
    fin = ~bad_o & torch.isfinite(r)
    if not fin.any():
        return Verdict(True, 0.0, 0.0)
    diff = (o - r).abs()[fin]
    err = float(diff.max())
    if dtype == torch.float32 or dtype == torch.float64:
        rtol, atol = tol if tol is not None else (FP32_RTOL, FP32_ATOL)
        allowed = atol + rtol * r.abs()[fin]
        extra = ""
        if ref_lp is not None:
            # only the fuzz passes an fp32 eager (module docstring): its draws may be arbitrarily
            # ill-conditioned, so the low-precision rule in fp32 is allowed beside the defaults
            lp_allow = _lp_allowance(ref_lp, r, fin, dtype)
            allowed = torch.maximum(allowed, lp_allow)
            extra = " (nor min(2 x torch-fp32 err, cap) + 1 ulp)"
        excess = diff - allowed
        worst = float(excess.max())
        ok = worst <= 0
        return Verdict(ok, err, atol, "" if ok else
                       f"max abs err {err:.3g} exceeds atol {atol:g} + rtol {rtol:g}*|ref|{extra}")
    # low precision (module docstring): min(2 x the error of plain PyTorch in the same dtype, a cap
    # relative to the tensor's largest reference value) + about one ulp of each element's own value
    finfo = torch.finfo(dtype)
    ra = r.abs()[fin]
    floor = finfo.eps * ra + float(finfo.tiny)
    lp_err, cap = _eager_error(ref_lp, r, fin)
    allow = min(2 * lp_err, cap)
    excess = diff - (allow + floor)
    ok = float(excess.max()) <= 0
    bound = allow + float(floor.max())
    capped = " (capped)" if 2 * lp_err > cap else ""
    return Verdict(ok, err, bound, "" if ok else
                   f"max abs err {err:.3g} > min(2 x torch-{dtype} err {lp_err:.3g}, cap {cap:.3g}){capped} "
                   "+ 1 ulp of the reference")


def _eager_error(ref_lp, r: torch.Tensor, fin: torch.Tensor) -> tuple[float, float]:
    """(E, cap) of the low-precision rule: eager's largest error where it is finite, and the cap."""
    lp_err = 0.0
    if ref_lp is not None:
        lpd = ref_lp.detach().double().cpu()
        m = fin & torch.isfinite(lpd)      # a NaN/inf eager position gives no allowance
        if m.any():
            lp_err = float((lpd - r).abs()[m].max())
    return lp_err, max(CAP_REL * float(r.abs()[fin].max()), ZERO_LEVEL)


def _lp_allowance(ref_lp, r: torch.Tensor, fin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per finite element: min(2 E, cap) + eps |ref| + tiny, the low-precision rule's allowance."""
    lp_err, cap = _eager_error(ref_lp, r, fin)
    finfo = torch.finfo(dtype)
    return min(2 * lp_err, cap) + finfo.eps * r.abs()[fin] + float(finfo.tiny)
