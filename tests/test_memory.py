"""Huge-page host buffers (``tessera.memory``) and ``tessera.alloc_kv_cache``.

What is checked: the buffers are zero-filled, contiguous, 2 MiB aligned and backed by huge pages
wherever the host's THP mode allows it (read back from /proc/self/smaps); they stay mapped while
any view lives and are unmapped after the last one dies; small buffers, ``huge_pages=False`` and
hosts without THP get plain tensors; the KV caches work with append_kv and decode_attention
exactly like caches from ``torch.zeros``; bad arguments get errors naming them.
"""
from __future__ import annotations

import gc

import pytest
import torch

import tessera
from tessera import memory

MIB = 1 << 20
THP_ON = memory.huge_pages_mode() in ("always", "madvise")


def _mapping(ptr):
    """(start, end, AnonHugePages kB) of the /proc/self/smaps entry holding address ptr, or None."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0] if line.strip() else ""
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                if found is not None:
                    return found
                if lo <= ptr < hi:
                    found = [lo, hi, 0]
            elif found is not None and line.startswith("AnonHugePages:"):
                found[2] = int(line.split()[1])
    return found


def test_huge_pages_mode_reads_the_host_setting():
    assert memory.huge_pages_mode() in ("always", "madvise", "never", "unavailable")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8, torch.float32])
def test_big_buffer_is_zero_aligned_and_huge_page_backed(dtype):
    t = memory.zeros((3, 1025, 1031), dtype)  # odd sizes, > 2 MiB in every dtype
    assert t.shape == (3, 1025, 1031) and t.dtype == dtype and t.is_contiguous()
    assert not t.any()
    t.fill_(1)  # touch every page
    assert int(t.sum(dtype=torch.float64)) == t.numel()
    if THP_ON:
        assert t.data_ptr() % memory.HUGE_PAGE == 0
        m = _mapping(t.data_ptr())
        assert m is not None and m[1] - m[0] >= t.numel() * t.element_size()
        # the host may be short of free huge pages; one 2 MiB page is the least it must give here
        assert m[2] >= 2048, f"no huge pages behind the buffer (mode {memory.huge_pages_mode()}): {m}"


def test_mapping_lives_as_long_as_a_view_and_is_unmapped_after(monkeypatch):
    monkeypatch.setattr(memory, "huge_pages_mode", lambda: "madvise")  # the mmap path on any Linux host
    t = memory.zeros((4 * MIB,), torch.uint8)
    ptr = t.data_ptr()
    assert ptr % memory.HUGE_PAGE == 0
    view = t[MIB:].view(3, MIB)
    del t
    gc.collect()
    view.fill_(5)
    assert _mapping(ptr) is not None and int(view.sum()) == 5 * 3 * MIB
    del view
    gc.collect()
    assert _mapping(ptr) is None, "the mapping outlived every tensor viewing it"


def _no_mmap(*a, **k):
    raise AssertionError("mmap used for a buffer that should be a plain tensor")


@pytest.mark.parametrize("shape, kw, mode", [
    ((MIB // 4 - 1,), {}, "madvise"),             # under 2 MiB
    ((8, MIB), {"huge_pages": False}, "madvise"),  # opted out
    ((8, MIB), {}, "never"),                       # host without THP
    ((8, MIB), {"device": "meta"}, "madvise"),     # not the CPU
    ((0, 5), {}, "madvise"), ((), {}, "madvise"),
])
def test_small_opted_out_or_unsupported_buffers_are_plain_zeros(monkeypatch, shape, kw, mode):
    monkeypatch.setattr(memory, "huge_pages_mode", lambda: mode)
    monkeypatch.setattr(memory.mmap, "mmap", _no_mmap)
    t = memory.zeros(shape, torch.float32, **kw)
    assert t.shape == shape and t.dtype == torch.float32
    if t.device.type == "cpu":
        assert not t.any()


def test_zeros_rejects_bad_arguments():
    with pytest.raises(ValueError, match="'shape'.*negative"):
        memory.zeros((2, -1), torch.float32)
    with pytest.raises(TypeError, match="'dtype'"):
        memory.zeros((2,), "float32")
    with pytest.raises(TypeError, match="'shape'"):
        memory.zeros(None, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.float8_e4m3fn])
def test_alloc_kv_cache_shapes_and_scales(dtype):
    k, v, ks, vs = tessera.alloc_kv_cache(37, 16, 8, 128, dtype)
    for c in (k, v):
        assert c.shape == (37, 16, 8, 128) and c.dtype == dtype and c.is_contiguous() and not c.float().any()
    assert k.data_ptr() != v.data_ptr()
    if dtype in (torch.int8, torch.float8_e4m3fn):
        for s in (ks, vs):
            assert s.shape == (37, 16, 8) and s.dtype == torch.float32 and not s.any()
        assert ks.data_ptr() != vs.data_ptr()
    else:
        assert ks is None and vs is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_alloc_kv_cache_serves_append_and_decode_like_plain_tensors(dtype):
    """Same tokens appended into an alloc_kv_cache cache (huge pages) and into torch.zeros caches:
    bit-identical caches and decode outputs."""
    g = torch.Generator().manual_seed(3)
    NB, P, Hk, D, B, n = 80, 16, 4, 128, 3, 300  # 80*16*4*128 bf16 = 1.25 MiB per cache; int8 + scales
    big = tessera.alloc_kv_cache(NB * 4, P, Hk, D, dtype)  # >= 2 MiB: the huge-page path
    plain = tuple(None if t is None else torch.zeros_like(t) for t in big)
    bt = torch.randperm(NB * 4, generator=g)[:B * 20].view(B, 20).to(torch.int32)
    k = torch.randn(B, n, Hk, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, n, Hk, D, generator=g).to(torch.bfloat16)
    pos = torch.zeros(B, dtype=torch.int32)
    for caches in (big, plain):
        tessera.append_kv(k, v, caches[0], caches[1], bt, pos, caches[2], caches[3])
    for a, b in zip(big, plain):
        if a is not None:
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    q = torch.randn(B, 4 * Hk, D, generator=g).to(torch.bfloat16)
    lens = torch.tensor([n, 17, 1], dtype=torch.int32)
    outs = [tessera.decode_attention(q, c[0], c[1], bt, lens, k_scale=c[2], v_scale=c[3]) for c in (big, plain)]
    assert torch.equal(outs[0], outs[1]) and outs[0].abs().sum() > 0


@pytest.mark.parametrize("arg, value, match", [
    ("num_blocks", 0, "'num_blocks'"), ("page_size", -1, "'page_size'"), ("num_kv_heads", 2.0, "'num_kv_heads'"),
    ("head_dim", True, "'head_dim'"), ("dtype", torch.int32, "'dtype'"),
])
def test_alloc_kv_cache_rejects_bad_arguments(arg, value, match):
    kw = {"num_blocks": 4, "page_size": 16, "num_kv_heads": 2, "head_dim": 64, "dtype": torch.bfloat16, arg: value}
    with pytest.raises(ValueError, match=match):
        tessera.alloc_kv_cache(**kw)
