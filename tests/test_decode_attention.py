"""Paged KV cache ops: append_kv quantisation golden vectors, cross-backend bit-exactness,
quantised-cache matrix cells, end-to-end decode, and error messages.

The generic matrix (tests/test_matrix.py) upcasts every input to float64 for the reference,
which then cannot tell an int8 cache from an fp8 one; the quantised append_kv cases
(``append_kv.cases.cases(quantised=True)``) are therefore run here with the reference given
the caches in their own dtypes, and compared bit for bit (outputs of int8/fp8 dtype) on every
backend.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import tessera
from tessera._registry import backend_available
from tessera.ops.append_kv import SPEC as APPEND
from tessera.ops.append_kv.cases import cases as append_cases
from tessera.ops.append_kv.ref import quantize
from tessera.testing import matrix

I8, F8 = torch.int8, torch.float8_e4m3fn


def _backends():
    return [b for b in ("reference", "cpu", "triton", "opencl") if backend_available(b, torch.device("cpu"))[0]]


BACKENDS = _backends()
# the native backends without the (slow) Triton interpreter: error paths and the hypothesis fuzz
NATIVE = [b for b in ("cpu", "opencl") if b in BACKENDS]


def _one_page(x, fmt, backend):
    """Append x (D,) as one token of one head into a fresh 1-page cache; -> (q row, scale)."""
    D = x.shape[-1]
    k = x.view(1, 1, D)
    kc = torch.zeros(1, 1, 1, D, dtype=fmt)
    vc = torch.zeros_like(kc)
    ks = torch.full((1, 1, 1), -1.0)
    vs = torch.full((1, 1, 1), -1.0)
    tessera.append_kv(k, k.clone(), kc, vc, torch.zeros(1, 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                      ks, vs, backend=backend)
    assert torch.equal(kc.view(torch.uint8), vc.view(torch.uint8)) and torch.equal(ks, vs)
    return kc.view(-1), ks.view(())


NAN = float("nan")
GOLDEN = [
    # (format, x, expected codes, expected scale): ties go to even, NaN -> 0, -0.0 keeps its sign in fp8
    (I8, [127, 63.5, -0.5, 1.5, 2.5, NAN, 0, -126.5], [127, 64, 0, 2, 2, 0, 0, -126], 1.0),
    (I8, [254, 5, 7, -3, -1, 1, 3, -254], [127, 2, 4, -2, 0, 0, 2, -127], 2.0),
    (F8, [448, 1, -2, 0, NAN, 17, 19, 2 ** -9, 3 * 2 ** -10, -0.0],
     [0x7E, 0x38, 0xC0, 0x00, 0x00, 0x58, 0x5A, 0x01, 0x02, 0x80], 1.0),
    (F8, [-896, 34, 38, 0.5], [0xFE, 0x58, 0x5A, 0x28], 2.0),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("i", range(len(GOLDEN)))
def test_quant_golden_vectors(i, backend):
    fmt, x, codes, scale = GOLDEN[i]
    q, s = _one_page(torch.tensor(x, dtype=torch.float32), fmt, backend)
    assert float(s) == scale
    got = q.view(torch.uint8).tolist() if fmt == F8 else q.tolist()
    assert got == codes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", [I8, F8])
def test_quant_zero_vector(fmt, backend):
    """An all-zero vector: scale = fp32(1e-12) / QMAX (computed here with numpy), codes 0."""
    q, s = _one_page(torch.zeros(16), fmt, backend)
    qmax = np.float32(127.0 if fmt == I8 else 448.0)
    assert float(s) == float(np.float32(1e-12) / qmax)
    assert q.view(torch.uint8).tolist() == [0] * 16


def _wide_range_kv(gen, B=3, n=5, Hk=4, D=64):
    """Vectors spanning 1e-30 .. 1e30 (fp8 subnormals, near-ties), with NaN and zero rows."""
    x = torch.randn(B, n, Hk, D, generator=gen)
    mag = 10.0 ** (torch.rand(B, n, Hk, 1, generator=gen) * 60 - 30)
    x = x * mag
    x[0, 0, 0, 1] = NAN
    x[1, 1, 1] = 0.0
    x[2, 2, 2, :4] = torch.tensor([1e-40, -1e-41, 3e-39, 0.0])  # fp32 subnormal inputs
    return x


@pytest.mark.parametrize("fmt", [I8, F8])
def test_append_quantised_bit_exact_across_backends(fmt):
    """Codes and scales are identical (torch.equal) on every backend, for values across the fp32 range."""
    gen = torch.Generator().manual_seed(7)
    k = _wide_range_kv(gen)
    v = _wide_range_kv(gen)
    B, n, Hk, D = k.shape
    nb, P = 9, 4
    bt = torch.randperm(nb, generator=gen)[:B * 3].view(B, 3).to(torch.int32)
    pos = torch.tensor([0, 3, 7], dtype=torch.int32)
    results = {}
    for b in BACKENDS:
        kc, vc = torch.zeros(nb, P, Hk, D, dtype=fmt), torch.zeros(nb, P, Hk, D, dtype=fmt)
        ks, vs = torch.zeros(nb, P, Hk), torch.zeros(nb, P, Hk)
        results[b] = tessera.append_kv(k, v, kc, vc, bt, pos, ks, vs, backend=b)
    want = results["reference"]
    qk, sk = quantize(k, fmt)  # the contract, directly
    assert torch.equal(want[2][bt[0, 0].long(), 0], sk[0, 0])
    assert torch.equal(want[0][bt[0, 0].long(), 0].view(torch.uint8), qk[0, 0].view(torch.uint8))
    for b, got in results.items():
        for i, (g, w) in enumerate(zip(got, want)):
            assert torch.equal(g.view(torch.uint8) if fmt == F8 and i < 2 else g,
                               w.view(torch.uint8) if fmt == F8 and i < 2 else w), f"{b}: output {i} differs"


def test_fp8_encoder_matches_torch_cast():
    """The integer fp8 encoders (C and Triton) agree with torch's fp32 -> e4m3fn cast on every
    value class: every e4m3fn number, the midpoints between neighbours (ties), and random values."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes.view(F8).float()
    fin = vals[torch.isfinite(vals) & (vals.abs() <= 448)].unique()
    mids = (fin[1:] + fin[:-1]) / 2
    rnd = (torch.rand(4000, generator=torch.Generator().manual_seed(3)) * 2 - 1) * 448
    xs = torch.cat([fin, mids, rnd, -mids])
    xs = xs[: (xs.numel() // 64) * 64].view(-1, 64)
    for row in xs:
        row = row.clone()
        row[0] = 448.0  # scale exactly 1: q == x
        want = row.to(F8).view(torch.uint8)
        for b in BACKENDS:
            q, s = _one_page(row, F8, b)
            assert float(s) == 1.0
            assert torch.equal(q.view(torch.uint8), want), b


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_append_float_cache_of_other_dtype(cache_dtype, backend):
    """fp32 k/v into fp16/bf16 caches: round to nearest even, exactly torch's .to()."""
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(2, 3, 2, 40, generator=gen) * 1e3
    k[0, 0, 0, 0] = 70000.0  # overflows fp16 -> inf
    v = torch.randn(2, 3, 2, 40, generator=gen)
    kc = torch.zeros(5, 4, 2, 40, dtype=cache_dtype)
    vc = torch.zeros_like(kc)
    bt = torch.tensor([[3, 1], [0, 4]], dtype=torch.int32)
    tessera.append_kv(k, v, kc, vc, bt, torch.tensor([2, 5], dtype=torch.int32), backend=backend)
    assert torch.equal(kc[3, 2:], k[0, :2].to(cache_dtype)) and torch.equal(kc[1, 0], k[0, 2].to(cache_dtype))
    assert torch.equal(vc[4, 1:4], v[1].to(cache_dtype))
    assert int((kc != 0).any(-1).any(-1).sum()) == 6  # nothing else written


# ---------------------------------------------------------------- quantised matrix cells

def _keep_dtypes(orig):
    def patched(kw, names, dtype=None, copy=False, place=None):
        out, leaves = orig(kw, names, dtype, copy, place)
        if dtype is not None:  # the reference gets integer / fp8 tensors as they are
            for k, v in kw.items():
                if isinstance(v, torch.Tensor) and (not v.is_floating_point() or v.element_size() == 1):
                    out[k] = v.detach().clone()
        return out, leaves
    return patched


def _quant_params():
    out = []
    for case in append_cases(quantised=True):
        for b in BACKENDS:
            for dt in APPEND.dtypes:
                out.append(pytest.param(b, dt, case, id=f"append_kv-{b}-{str(dt)[6:]}-{case.name}"))
    return out


@pytest.mark.parametrize("backend,dtype,case", _quant_params())
def test_append_quantised_matrix(backend, dtype, case, monkeypatch):
    monkeypatch.setattr(matrix, "_inputs", _keep_dtypes(matrix._inputs))
    r = matrix.run_case(APPEND, backend, dtype, case)
    assert r.ok, r.why


# ---------------------------------------------------------------- end to end

@pytest.mark.parametrize("fmt", [torch.bfloat16, I8, F8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_append_then_decode_matches_sdpa(fmt, backend):
    """Prefill 37 tokens + 2 decode steps through append_kv, then decode_attention == SDPA on the
    dequantised contiguous K/V (what the cache holds), within fp32 accuracy."""
    gen = torch.Generator().manual_seed(5)
    B, Hq, Hk, D, P = 2, 8, 2, 64, 16
    nb = 8
    kc, vc = torch.zeros(nb, P, Hk, D, dtype=fmt), torch.zeros(nb, P, Hk, D, dtype=fmt)
    scales = (torch.zeros(nb, P, Hk), torch.zeros(nb, P, Hk)) if fmt in (I8, F8) else (None, None)
    bt = torch.tensor([[5, 2, 7], [0, 6, 3]], dtype=torch.int32)
    ks, vs = [], []
    for pos, n in ((0, 37), (37, 1), (38, 1)):
        k, v = torch.randn(B, n, Hk, D, generator=gen), torch.randn(B, n, Hk, D, generator=gen)
        tessera.append_kv(k, v, kc, vc, bt, torch.full((B,), pos, dtype=torch.int32), *scales, backend=backend)
        ks.append(k), vs.append(v)
    q = torch.randn(B, Hq, D, generator=gen)
    lens = torch.full((B,), 39, dtype=torch.int32)
    out = tessera.decode_attention(q, kc, vc, bt, lens, k_scale=scales[0], v_scale=scales[1], backend=backend)
    t = torch.arange(39)
    pages = bt.long()[:, t // P]

    def deq(c, s):
        x = c[pages, t % P].double()
        return x if s is None else x * s[pages, t % P].double()[..., None]
    K, V = deq(kc, scales[0]).transpose(1, 2), deq(vc, scales[1]).transpose(1, 2)
    want = torch.nn.functional.scaled_dot_product_attention(q.double()[:, :, None], K, V, enable_gqa=True)[:, :, 0]
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    if fmt == torch.bfloat16:  # the cache holds exactly the appended values, rounded
        assert torch.equal(K.transpose(1, 2).float(), torch.cat(ks, 1).to(fmt).float())


@pytest.mark.skipif("opencl" not in BACKENDS, reason="no OpenCL device")
@pytest.mark.parametrize("variant", ["same", torch.float16, I8, F8])
def test_opencl_decode_local_size_does_not_change_outputs(variant, monkeypatch):
    """The opencl decode kernel's loops stride by the local size and each element's arithmetic does
    not depend on it: bit-identical outputs for odd sizes too (GQA 3, D = 72: a tail chunk)."""
    from tessera.ops.decode_attention import opencl as docl
    kw = _decode_case("x", 3, 6, 2, 72, 16, [300, 0, 77], variant=variant, softcap=5.0).make(
        torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(3))
    outs = []
    for L in (1, 7, 64, 256):
        monkeypatch.setattr(docl, "LOCAL_SIZE", L)
        outs.append(tessera.decode_attention(**kw, backend="opencl"))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])


# ---------------------------------------------------------------- errors

def _append_args(fmt=torch.float16):
    k = torch.randn(2, 3, 2, 8)
    kc = torch.zeros(4, 4, 2, 8, dtype=fmt)
    quant = fmt in (I8, F8)
    return dict(k=k, v=k.clone(), k_cache=kc, v_cache=kc.clone(), block_table=torch.tensor([[0, 1], [2, 3]],
                dtype=torch.int32), positions=torch.tensor([0, 4], dtype=torch.int32),
                k_scale=torch.zeros(4, 4, 2) if quant else None, v_scale=torch.zeros(4, 4, 2) if quant else None)


def _decode_args(fmt=torch.float16):
    a = _append_args(fmt)
    return dict(q=torch.randn(2, 4, 8), k_cache=a["k_cache"], v_cache=a["v_cache"], block_table=a["block_table"],
                seq_lens=torch.tensor([3, 8], dtype=torch.int32), k_scale=a["k_scale"], v_scale=a["v_scale"])


def _mod(d, **kw):
    d = dict(d)
    d.update(kw)
    return d


APPEND_BAD = [
    ("table-entry-out-of-range", lambda a: _mod(a, block_table=torch.tensor([[0, 1], [2, 4]], dtype=torch.int32)),
     ValueError, ["'block_table'", "entry 4", "[1, 1]", "[0, 4)", "(2, 2)"]),
    ("table-entry-negative", lambda a: _mod(a, block_table=torch.tensor([[-1, 1], [2, 3]], dtype=torch.int32)),
     ValueError, ["'block_table'", "entry -1"]),
    ("positions-past-capacity", lambda a: _mod(a, positions=torch.tensor([0, 6], dtype=torch.int32)),
     ValueError, ["'positions'", "capacity 8"]),
    ("positions-negative", lambda a: _mod(a, positions=torch.tensor([-1, 0], dtype=torch.int32)),
     ValueError, ["'positions'", "0 <= positions"]),
    ("positions-int64", lambda a: _mod(a, positions=a["positions"].long()), TypeError, ["'positions'", "int64"]),
    ("table-float", lambda a: _mod(a, block_table=a["block_table"].float()), TypeError, ["'block_table'", "float32"]),
    ("table-rows", lambda a: _mod(a, block_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError,
     ["'block_table'", "(3, 2)", "(2, *)"]),
    ("cache-dtype-mismatch", lambda a: _mod(a, v_cache=a["v_cache"].float()), TypeError, ["'v_cache'", "float16"]),
    ("cache-int32", lambda a: _mod(a, k_cache=a["k_cache"].int()), TypeError, ["'k_cache'", "int32"]),
    ("head-dim-mismatch", lambda a: _mod(a, k=torch.randn(2, 3, 2, 9), v=torch.randn(2, 3, 2, 9)), ValueError,
     ["'k'", "(2, 3, 2, 9)", "(2, 8)"]),
    ("scale-for-float-cache", lambda a: _mod(a, k_scale=torch.zeros(4, 4, 2)), ValueError, ["'k_scale'", "None"]),
    ("cache-noncontiguous", lambda a: _mod(a, k_cache=a["k_cache"].transpose(0, 1), v_cache=a["k_cache"].transpose(0, 1)),
     ValueError, ["'k_cache'", "contiguous"]),
]
APPEND_BAD_QUANT = [
    ("scale-missing", lambda a: _mod(a, v_scale=None), ValueError, ["'v_scale'", "required", "(4, 4, 2)"]),
    ("scale-shape", lambda a: _mod(a, k_scale=torch.zeros(4, 4, 3)), ValueError, ["'k_scale'", "(4, 4, 3)"]),
    ("scale-fp16", lambda a: _mod(a, k_scale=torch.zeros(4, 4, 2, dtype=torch.float16)), TypeError,
     ["'k_scale'", "float16"]),
]


@pytest.mark.parametrize("backend", ["reference"] + NATIVE)
@pytest.mark.parametrize("fmt,name,make,exc,needles",
                         [(torch.float16, *x) for x in APPEND_BAD] + [(I8, *x) for x in APPEND_BAD_QUANT],
                         ids=lambda x: x if isinstance(x, str) else None)
def test_append_errors_write_nothing(fmt, name, make, exc, needles, backend):
    a = make(_append_args(fmt))
    before = {k: v.clone() for k, v in a.items() if k in ("k_cache", "v_cache") and v.is_contiguous()}
    with pytest.raises(exc) as info:
        tessera.append_kv(**a, backend=backend)
    msg = str(info.value)
    assert "tessera.append_kv" in msg
    for n in needles:
        assert n in msg, f"{msg!r} lacks {n!r}"
    for k, v in before.items():
        assert torch.equal(a[k].view(torch.uint8) if a[k].element_size() == 1 else a[k], 
                           v.view(torch.uint8) if v.element_size() == 1 else v), f"{k} was modified"


DECODE_BAD = [
    ("seq-lens-past-capacity", dict(seq_lens=torch.tensor([3, 9], dtype=torch.int32)), ValueError,
     ["'seq_lens'", "[0, 8]"]),
    ("seq-lens-negative", dict(seq_lens=torch.tensor([-1, 2], dtype=torch.int32)), ValueError, ["'seq_lens'"]),
    ("table-entry-out-of-range", dict(block_table=torch.tensor([[0, 9], [2, 9]], dtype=torch.int32)), ValueError,
     ["'block_table'", "entry 9", "[1, 1]", "[0, 4)"]),
    ("gqa-not-divisible", dict(q=torch.randn(2, 3, 8)), ValueError, ["'k_cache'", "Hq = 3"]),
    ("window-zero", dict(window=0), ValueError, ["'window'", "0"]),
    ("window-float", dict(window=2.0), TypeError, ["'window'", "float"]),
    ("softcap-negative", dict(softcap=-1.0), ValueError, ["'softcap'", "-1.0"]),
    ("scale-nan", dict(scale=float("nan")), ValueError, ["'scale'", "nan"]),
    ("seq-lens-int64", dict(seq_lens=torch.tensor([3, 8])), TypeError, ["'seq_lens'", "int64"]),
    ("q-2d", dict(q=torch.randn(2, 8)), ValueError, ["'q'", "(2, 8)"]),
]


@pytest.mark.parametrize("backend", ["reference"] + NATIVE)
@pytest.mark.parametrize("name,kw,exc,needles", DECODE_BAD, ids=[x[0] for x in DECODE_BAD])
def test_decode_errors(name, kw, exc, needles, backend):
    with pytest.raises(exc) as info:
        tessera.decode_attention(**_mod(_decode_args(), **kw), backend=backend)
    msg = str(info.value)
    assert "tessera.decode_attention" in msg
    for n in needles:
        assert n in msg, f"{msg!r} lacks {n!r}"


def test_unused_table_entries_are_not_checked():
    """Entries past a sequence's pages (or before its window) may hold anything, e.g. -1 padding."""
    a = _decode_args()
    bt = torch.tensor([[0, -1], [2, 3]], dtype=torch.int32)  # sequence 0 has 3 tokens: one page
    out = tessera.decode_attention(**_mod(a, block_table=bt), backend="cpu")
    ref = tessera.decode_attention(**_mod(a, block_table=bt), backend="reference")
    torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-5)
    bt2 = torch.tensor([[0, 1], [-1, 3]], dtype=torch.int32)  # window 3 of 8 tokens: page 0 unused
    tessera.decode_attention(**_mod(a, block_table=bt2, window=3), backend="cpu")


# ---------------------------------------------------------------- triton: GPU compile without a GPU

def _nvidia_backend():
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        import triton.backends.nvidia  # noqa: F401
        return True
    except Exception:
        return False


_SM90_SCRIPT = r"""
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tessera.ops.append_kv import triton as at
from tessera.ops.decode_attention import triton as dt
target = GPUTarget("cuda", 90, 32)

def build(fn, sig, consts):
    sig = {**sig, **{k: "constexpr" for k in consts}}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target).asm

for kind, cty in ((0, "*bf16"), (1, "*i8"), (2, "*u8")):
    sig = {"q_ptr": "*bf16", "kc_ptr": cty, "vc_ptr": cty, "ks_ptr": "*fp32", "vs_ptr": "*fp32", "bt_ptr": "*i32",
           "sl_ptr": "*i32", "pm_ptr": "*fp32", "pl_ptr": "*fp32", "pa_ptr": "*fp32", "MB": "i32", "P": "i32",
           "S": "i32", "scale": "fp32", "softcap": "fp32", "window": "i32"}
    consts = {"HQ": 32, "HK": 8, "G": 4, "D": 128, "BLOCK_G": 4, "BLOCK_D": 128, "BLOCK_N": 16, "KIND": kind,
              "SOFTCAP": True}
    assert "cubin" in build(dt._split_kernel, sig, consts)
consts = {"HQ": 32, "HK": 8, "G": 4, "D": 128, "BLOCK_S": 8, "BLOCK_D": 128}
sig = {"pm_ptr": "*fp32", "pl_ptr": "*fp32", "pa_ptr": "*fp32", "o_ptr": "*bf16", "S": "i32"}
assert "cubin" in build(dt._combine_kernel, sig, consts)
for kind, cty in ((0, "*fp16"), (1, "*i8"), (2, "*u8"), (3, "*i16")):
    sig = {"x_ptr": "*fp32", "c_ptr": cty, "s_ptr": "*fp32", "bt_ptr": "*i32", "pos_ptr": "*i32", "n_new": "i32",
           "MB": "i32", "P": "i32"}
    consts = {"HK": 8, "D": 128, "BLOCK_H": 8, "BLOCK_D": 128, "KIND": kind, "QMAX": 448.0 if kind == 2 else 127.0,
              "HW_RINT": True}
    asm = build(at._append_kernel, sig, consts)
    if kind in (1, 2):
        ops = set(re.findall(r"\b(div\.[a-z.]+f32|cvt\.rni\.f32\.f32)", asm["ptx"]))
        assert "div.rn.f32" in ops and not ops & {"div.full.f32", "div.approx.f32"}, ops
        assert kind == 2 or "cvt.rni.f32.f32" in ops, ops
print("ok")
"""


@pytest.mark.skipif(not _nvidia_backend(), reason="triton's NVIDIA backend (ptxas) is not installed")
def test_triton_kernels_compile_for_sm90():
    """The interpreter runs the kernels as Python; this compiles them to cubin for sm_90 (ahead of time,
    no GPU needed; a subprocess without TRITON_INTERPRET) and checks that the append kernel's PTX uses
    IEEE division (div.rn) and rint (cvt.rni), as the quantisation contract requires."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", _SM90_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


# ---------------------------------------------------------------- property-based fuzzing (spec.fuzz)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tessera.ops.append_kv.cases import _build as _append_case  # noqa: E402
from tessera.ops.decode_attention import SPEC as DECODE  # noqa: E402
from tessera.ops.decode_attention.cases import build as _decode_case  # noqa: E402

_FUZZ = settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
_CACHES = ["same", torch.float16, torch.bfloat16, I8, F8]


@_FUZZ
@given(B=st.integers(1, 6), G=st.sampled_from([1, 2, 3, 4, 8]), Hk=st.integers(1, 3), D=st.integers(1, 140),
       P=st.sampled_from([1, 2, 16, 64]), lens=st.lists(st.integers(0, 300), min_size=6, max_size=6),
       window=st.sampled_from([-1, 1, 7, 64]), softcap=st.sampled_from([0.0, 2.0, 30.0]),
       cache=st.sampled_from(_CACHES), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
@pytest.mark.parametrize("backend", NATIVE)
def test_fuzz_decode_attention_vs_reference(backend, B, G, Hk, D, P, lens, window, softcap, cache, dtype):
    case = _decode_case(f"fuzz-{B}-{G}-{Hk}-{D}-{P}-{lens}-{window}-{softcap}", B, G * Hk, Hk, D, P, lens[:B],
                        variant=cache, window=window, softcap=softcap, qscale=2.0)
    r = matrix.run_case(DECODE, backend, dtype, case)
    assert r.ok, f"{case.name} cache={cache} {dtype}: {r.why}"


@_FUZZ
@given(B=st.integers(1, 5), n_new=st.sampled_from([None, 1, 2, 9, 33]), Hk=st.integers(1, 4), D=st.integers(1, 130),
       P=st.sampled_from([1, 3, 16, 64]), pos=st.lists(st.integers(0, 100), min_size=5, max_size=5),
       cache=st.sampled_from(["same", I8, F8]), dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
@pytest.mark.parametrize("backend", NATIVE)
def test_fuzz_append_kv_vs_reference(backend, B, n_new, Hk, D, P, pos, cache, dtype):
    """Float caches in k's dtype (the matrix judges outputs in the case dtype; fp32 k into fp16/bf16
    caches is checked bit for bit in test_append_float_cache_of_other_dtype) and int8/fp8 caches."""
    case = _append_case(f"fuzz-{B}-{n_new}-{Hk}-{D}-{P}-{pos}", B, n_new, Hk, D, P, pos[:B], variant=cache)
    orig = matrix._inputs
    matrix._inputs = _keep_dtypes(orig)  # quantised caches reach the reference in their dtype
    try:
        r = matrix.run_case(APPEND, backend, dtype, case)
    finally:
        matrix._inputs = orig
    assert r.ok, f"{case.name} cache={cache} {dtype}: {r.why}"


@pytest.mark.parametrize("backend", ["reference"] + NATIVE)
def test_decode_ignores_table_entries_it_does_not_read(backend):
    """Columns past a sequence's length or before its window may hold anything (vLLM leaves them
    stale): they must not raise, and the result equals the one with valid entries there."""
    a = _decode_args(torch.float32)
    a["k_cache"], a["v_cache"] = torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 8)
    good = tessera.decode_attention(**a, window=2, backend=backend)
    stale = _mod(a, block_table=torch.tensor([[0, 99], [-5, 3]], dtype=torch.int32))
    assert torch.equal(tessera.decode_attention(**stale, window=2, backend=backend), good)
    with pytest.raises(ValueError, match="entry -5"):  # without the window, column 0 of sequence 1 is read
        tessera.decode_attention(**stale, backend=backend)


def _xor_words(t: torch.Tensor) -> int:
    """xor of a row's 8-byte words, its tail padded with zero bytes (paged_read.c's rule)."""
    b = t.contiguous().view(torch.uint8).numpy().tobytes()
    b += bytes(-len(b) % 8)
    return int(np.bitwise_xor.reduce(np.frombuffer(b, dtype=np.uint64), initial=np.uint64(0)))


@pytest.mark.parametrize("variant", ["same", torch.int8])
@pytest.mark.parametrize("window", [-1, 70])
def test_paged_read_reads_exactly_the_attended_rows(variant, window):
    """The bench's layout read (OpSpec.layout_read, paged_read.c) reads every attended token's K
    and V rows (all kv heads) and scales once and nothing else: its xor of the words read equals
    the host's over those rows, on shuffled pages, a window, odd lengths and several splits."""
    if not backend_available("cpu", torch.device("cpu"))[0]:
        pytest.skip("no C compiler")
    kw = _decode_case("x", 3, 8, 2, 24, 16, [1000, 0, 77], variant=variant, window=window).make(
        torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(7))
    expect = 0
    bt = kw["block_table"]
    for b, n in enumerate(kw["seq_lens"].tolist()):
        for t in range(max(0, n - window) if window > 0 else 0, n):
            pg, slot = int(bt[b, t // 16]), t % 16
            for name in ("k_cache", "v_cache", "k_scale", "v_scale"):
                if kw[name] is not None:
                    expect ^= _xor_words(kw[name][pg, slot])
    read = DECODE.layout_read(kw)
    assert read() == expect != 0
