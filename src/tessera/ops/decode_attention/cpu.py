"""Paged decode attention native CPU launcher (kernel: decode_attention.c, AVX-512 inner loops in
decode_fast.h: vdpbf16ps for bf16 q over a bf16 cache, int16 VNNI for bf16/fp16 q over an int8
cache, fp32 FMAs otherwise; portable C at the other ISA levels).

The kernel checks seq_lens and the block-table entries it will follow and picks its splits
itself (decode_attention.c), so a call does no host-side pass over the indices: decode is
called once per layer per token and that pass cost ~40 us a call.  When the kernel reports a
bad index, the op's Python check runs to name it."""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("decode_attention.c")
_READ_SRC = Path(__file__).with_name("paged_read.c")
from ..append_kv.cpu import CACHE_CODE  # noqa: E402  (one table of the C cache-dtype codes)


CHECKS_INDICES = True  # the op skips its host-side index pass for this backend (see above)


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    B, Hq, D = q.shape
    NB, P, Hk = k_cache.shape[:3]
    out = new_output((B, Hq, D), q.dtype, q.device)
    if B == 0:
        return out
    f = cpu.declare(cpu.library("decode_attention", _SRC), "tsr_decode_attention", "pppppppp" "lllllll" "ff" "l" "iii" "l")
    rc = f(cpu.ptr(q), cpu.ptr(k_cache), cpu.ptr(v_cache), cpu.ptr(k_scale), cpu.ptr(v_scale), cpu.ptr(block_table),
           cpu.ptr(seq_lens), cpu.ptr(out), B, Hq, Hk, D, P, block_table.shape[1], NB, scale, softcap, window,
           cpu.DTYPE_CODE[q.dtype], CACHE_CODE[k_cache.dtype], max(1, torch.get_num_threads()),
           cpu.PARALLEL_MIN_ELEMENTS)
    if rc == cpu.EINVAL:
        from . import check_indices  # names the bad seq_lens value or block_table entry
        check_indices(k_cache, block_table, seq_lens, window)
    cpu.check_rc(rc, "decode_attention")
    return out


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")


def paged_read(kw):
    """A no-arg callable reading exactly the bytes ``forward`` must read, in page order
    (paged_read.c), returning the xor of the words read: ``tessera bench``'s reference for
    what the memory system gives for this layout (``OpSpec.layout_read``)."""
    kc, vc, ks, vs = kw["k_cache"], kw["v_cache"], kw.get("k_scale"), kw.get("v_scale")
    bt, sl = kw["block_table"], kw["seq_lens"]
    f = cpu.library("decode_paged_read", _READ_SRC).tsr_decode_paged_read
    f.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_int]
    f.restype = ctypes.c_uint64
    NB, P, Hk, D = kc.shape
    args = (cpu.ptr(kc), cpu.ptr(vc), cpu.ptr(ks), cpu.ptr(vs), cpu.ptr(bt), cpu.ptr(sl), sl.shape[0], Hk, D, P,
            bt.shape[1], kc.element_size(), kw.get("window", -1), max(1, torch.get_num_threads()))
    keep = (kc, vc, ks, vs, bt, sl)  # the raw pointers' owners live as long as the callable
    return lambda: (keep, f(*args))[1]
