"""Paged decode attention native CPU launcher (kernel: decode_attention.c, AVX-512 inner loops in
decode_fast.h: vdpbf16ps for bf16 q over a bf16 cache, int16 VNNI for bf16/fp16 q over an int8
cache, fp32 FMAs otherwise; portable C at the other ISA levels).

Splits: each sequence's keys are cut into S splits (a task = one split of one sequence, all kv
heads) so that there are at least ~4 tasks per thread, but no split shorter than ~256 keys."""
from __future__ import annotations

from pathlib import Path

import torch

from ..._library import new_output
from ...backends import cpu
from ..append_kv.ref import CACHE_DTYPES  # noqa: F401  (every cache dtype)
from .ref import keys_read

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_SRC = Path(__file__).with_name("decode_attention.c")
CACHE_CODE = {**cpu.DTYPE_CODE, torch.int8: 8, torch.float8_e4m3fn: 9}


def splits(B, max_keys, threads):
    want = -(-4 * threads // max(1, B))
    return max(1, min(want, max_keys // 256))


def forward(q, k_cache, v_cache, block_table, seq_lens, scale, softcap, window, k_scale, v_scale, max_keys=None):
    B, Hq, D = q.shape
    Hk = k_cache.shape[2]
    out = new_output((B, Hq, D), q.dtype, q.device)
    if B == 0:
        return out
    if max_keys is None:
        max_keys = int(keys_read(seq_lens, window).max())
    T = cpu.threads_for(B * Hq * D * max(1, max_keys) // 4)
    S = splits(B, max_keys, T)
    part = torch.empty(B * Hk * S * (Hq // Hk) * (D + 2), dtype=torch.float32)
    f = cpu.declare(cpu.library("decode_attention", _SRC), "tsr_decode_attention", "ppppppppp" "lllllll" "ff" "l" "iii")
    rc = f(cpu.ptr(q), cpu.ptr(k_cache), cpu.ptr(v_cache), cpu.ptr(k_scale), cpu.ptr(v_scale), cpu.ptr(block_table),
           cpu.ptr(seq_lens), cpu.ptr(out), cpu.ptr(part), B, Hq, Hk, D, k_cache.shape[1], block_table.shape[1], S,
           scale, softcap, window, cpu.DTYPE_CODE[q.dtype], CACHE_CODE[k_cache.dtype], T)
    cpu.check_rc(rc, "decode_attention")
    return out


def backward(*args):
    raise NotImplementedError("decode_attention has no gradient (inference only)")
