"""The chunk loop of the fused linear cross-entropy: backend-independent glue around the
cross-entropy kernel module (``loss_rows``, see ops/cross_entropy/glue.py) of the selected
backend.  ``cpu.py`` and ``triton.py`` are this loop bound to that backend's kernel.

Per chunk of C tokens (Liger's design):

1. ``logits = hidden[c] @ weight.T (+ bias)`` into one reused (C, V) buffer (torch.mm / addmm:
   oneDNN or cuBLAS; the GEMM is not what is fused here);
2. the cross-entropy kernel computes the chunk's row losses and, when gradients are wanted,
   overwrites the logits buffer with d(loss)/d(logits) in the same pass (pre-scaled by the
   reduction: 1/n for a mean over the n non-ignored targets of the whole batch);
3. ``dhidden[c] = dlogits @ weight``; ``dweight += dlogits.T @ hidden[c]`` and
   ``dbias += dlogits.sum(0)``, accumulated in fp32 across chunks (:func:`accumulate_dw`).
   fp32 chunks accumulate in place with addmm_.  CPU torch has no bf16 GEMM with an fp32
   output, so a bf16 chunk's product is computed in bf16 (fp32 accumulation inside the GEMM,
   rounded once per chunk, as the unfused pair rounds its one dweight GEMM) a block of vocabulary
   rows at a time (a reused <= 32 MiB buffer) and added to the fp32 accumulator: each chunk
   costs one bf16 rounding of its own contribution, never of the running sum.  fp16 chunks are
   upcast to fp32 for that GEMM (an fp16 partial sum over a chunk of tokens could overflow).

So the full (tokens x vocab) logits exist neither in the forward nor in the backward: the
peak is the fp32 dweight accumulator (the gradient itself), dhidden and one chunk.  Chunk size
(:func:`chunk_tokens`): at least 8 chunks, but no chunk under 32 MiB of logits, and none over
256 MiB (counting the chunk's fp32 copy for dweight in fp16): 523 tokens of a 128256
vocabulary in fp32 (8192 tokens: 16 chunks of <= 256 MiB), 262 of 2048 tokens with a 32000
vocabulary (8 chunks of 32 MiB).  ``TESSERA_FLCE_CHUNK_BYTES`` fixes the budget instead
(tests force chunks of a few tokens with it).  Smaller chunks save memory but re-read weight (and read-modify-
write the fp32 dweight) once per chunk: (2 x itemsize + 8) V H bytes per 6 C H V FLOPs, about
1.4 GB/s at 256 fp32 tokens per chunk and 130 GFLOP/s -- a few % of this machine's bandwidth.

reduction="none" cannot be pre-scaled (each row's upstream gradient is only known in backward),
so its forward computes the losses only and its backward runs the loop again with the
upstream gradient of each row as the kernel's per-row scale (one more logits GEMM).
"""
from __future__ import annotations

import torch

from ... import _env
from ..._library import contiguous, new_output, rows
from ..cross_entropy import glue as ce_glue

OP = "fused_linear_cross_entropy"
CHUNK_BYTES = 256 << 20      # the most logits bytes (fp16: with their fp32 copy) in one chunk
CHUNK_MIN_BYTES = 32 << 20   # ... and the least, when the batch is split at all
CHUNKS = 8                   # chunks aimed for between those bounds


def chunk_tokens(T: int, V: int, dtype: torch.dtype, need_dw: bool) -> int:
    """Tokens per chunk: ceil(T / CHUNKS), kept within [CHUNK_MIN_BYTES, CHUNK_BYTES] of logits
    (fp16: and their fp32 copy for dweight), or the fixed ``TESSERA_FLCE_CHUNK_BYTES`` budget."""
    per_token = V * (dtype.itemsize + (4 if need_dw and dtype == torch.float16 else 0))
    fixed = _env.get("TESSERA_FLCE_CHUNK_BYTES")
    if fixed:
        c = int(fixed) // per_token
    else:
        c = min(CHUNK_BYTES // per_token, max(CHUNK_MIN_BYTES // per_token, -(-T // CHUNKS)))
    return max(1, min(T, c))


PARTIAL_BYTES = 32 << 20     # bf16: the reused buffer of one block of vocabulary rows of a chunk's dweight


def accumulate_dw(dw, z, hc, first, part):
    """dw (fp32) = / += z.T @ hc for one chunk (z: its gradient rows, hc: its hidden rows)."""
    if z.dtype == torch.float32:
        if first:
            torch.mm(z.t(), hc, out=dw)
        else:
            dw.addmm_(z.t(), hc)
    elif z.dtype == torch.bfloat16:
        vb = part.shape[0]
        for v0 in range(0, dw.shape[0], vb):
            v1 = min(dw.shape[0], v0 + vb)
            p = torch.mm(z[:, v0:v1].t(), hc, out=part[:v1 - v0])
            if first:
                dw[v0:v1].copy_(p)
            else:
                dw[v0:v1].add_(p)
    else:
        accumulate_dw(dw, z.float(), hc.float(), first, part)


def sweep(ce, hidden, weight, bias, t, opts, need_dh, need_dw, need_db, scale=1.0, row_scale=None):
    """One pass over the token chunks -> (row losses fp32 (T,), dhidden, dweight fp32, dbias fp32);
    gradients only where asked, each row's scaled by ``scale * row_scale[row]``."""
    ignore_index, ls, zl, sc = opts
    T, H = hidden.shape
    V = weight.shape[0]
    dev, dt = hidden.device, hidden.dtype
    grads = need_dh or need_dw or need_db
    C = chunk_tokens(T, V, dt, need_dw)
    one = T <= C  # a single chunk (every small call): no slices, and its row losses are the result
    loss = None if one and T else new_output((T,), torch.float32, dev)
    buf = new_output((min(C, T), V), dt, dev)
    dh = new_output((T, H), dt, dev) if need_dh else None
    dw = new_output((V, H), torch.float32, dev) if need_dw else None
    part = None
    if need_dw and dt == torch.bfloat16:
        part = new_output((max(1, min(V, PARTIAL_BYTES // (2 * H))), H), dt, dev)
    db = new_output((V,), torch.float32, dev) if need_db else None
    wt = weight.t()
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        hc, z, tc = (hidden, buf, t) if one else (hidden[c0:c1], buf[:c1 - c0], t[c0:c1])
        if bias is None:
            torch.mm(hc, wt, out=z)
        else:
            torch.addmm(bias, hc, wt, out=z)
        lc, _ = ce.loss_rows(z, tc, ignore_index, ls, zl, sc, z if grads else None, scale,
                             None if row_scale is None else row_scale[c0:c1])
        if one:
            loss = lc
        else:
            loss[c0:c1] = lc
        if need_dh:
            torch.mm(z, weight, out=dh[c0:c1])
        if need_dw:
            accumulate_dw(dw, z, hc, c0 == 0, part)
        if need_db:
            if c0 == 0:
                torch.sum(z, 0, dtype=torch.float32, out=db)
            else:
                db.add_(z.sum(0, dtype=torch.float32))
    if T == 0:  # no chunk ran: the sums over no tokens are 0
        for d in (dw, db):
            if d is not None:
                d.zero_()
    return loss, dh, dw, db


def _cast(d, dtype):
    return None if d is None else (d if d.dtype == dtype else d.to(dtype))


def _blas_ready(w):
    """weight as the GEMMs take it: row- or column-major (a transposed (H, V) buffer) as is, any
    other layout (a step-sliced or broadcast view) copied once.  A copy of a 128256 x 2048 fp32
    weight is 1 GiB, so the common layouts are never copied."""
    V, H = w.shape
    if (w.stride(1) == 1 and w.stride(0) >= max(H, 1)) or (w.stride(0) == 1 and w.stride(1) >= max(V, 1)):
        return w
    return contiguous(w)


def _inputs(ce, hidden, weight, bias, target, ignore_index):
    h = rows(hidden)
    t, n_valid = ce_glue.targets(OP, target, weight.shape[0], ignore_index, getattr(ce, "count_targets", None))
    return h, _blas_ready(weight), contiguous(bias), t, n_valid


def forward(ce, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap, reduction,
            need_dh, need_dw, need_db):
    """-> (loss in hidden's dtype, dhidden (T, H), dweight, dbias); gradients (for the reduction,
    upstream gradient 1) only for mean/sum, only those asked for; None otherwise."""
    h, w, b, t, n_valid = _inputs(ce, hidden, weight, bias, target, ignore_index)
    if reduction == "none":
        need_dh = need_dw = need_db = False
    loss, dh, dw, db = sweep(ce, h, w, b, t, (ignore_index, label_smoothing, z_loss, softcap), need_dh, need_dw,
                             need_db, ce_glue.grad_scale(reduction, n_valid))
    out = ce_glue.reduce(loss, reduction, n_valid, hidden.dtype)
    return out, dh, _cast(dw, weight.dtype), _cast(db, hidden.dtype if bias is None else bias.dtype)


def backward(ce, grad, dh, dw, db, hidden, weight, target, bias, ignore_index, label_smoothing, z_loss, softcap,
             reduction, need_dh, need_dw, need_db):
    """mean/sum: the saved gradients times the scalar upstream gradient (one rounding); none: the
    loop again, with each row's upstream gradient as its scale."""
    if reduction != "none":
        g = grad.reshape(()).to(torch.float32)
        return tuple(None if d is None else d * g for d in (dh, dw, db))
    h, w, b, t, _ = _inputs(ce, hidden, weight, bias, target, ignore_index)
    g = contiguous(grad.reshape(-1).to(torch.float32))
    _, dh, dw, db = sweep(ce, h, w, b, t, (ignore_index, label_smoothing, z_loss, softcap), need_dh, need_dw,
                          need_db, 1.0, g)
    return dh, _cast(dw, weight.dtype), _cast(db, None if bias is None else bias.dtype)
