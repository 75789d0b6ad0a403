"""``tessera.rope`` / ``tessera.rope_cache`` beyond the spec-generated tests.

* rope_cache: every scaling rule against a scalar re-derivation (Python ``math``, one
  frequency at a time), dtype/device handling and its errors;
* rope: errors for position ids and shapes (the generic bad-input test cannot break ids:
  int32 is a valid id dtype), identity at position 0 (bit-exact on every backend),
  independence of heads and of q/k, inverse rotation, buffers get no gradient, broadcast
  (stride-0) inputs, the CPU kernel's own bounds check;
* opcheck and torch.compile with position ids / interleaved (the generic tests pick the
  smallest cases only);
* a hypothesis fuzz of random shapes/options/layouts, cpu (and opencl where a device is found)
  vs the float64 reference (the generic ``tests/test_fuzz.py`` cannot infer the roles of the
  cos/sin tables and ids);
* opencl: the kernel's own bounds check, and outputs independent of the work-group size.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from tessera._registry import Case, backend_available
from tessera.backends import triton as triton_backend
from tessera.ops.rope import cases as rope_cases
from tessera.testing.matrix import run_case

SPEC = tessera.OPS["rope"]
OPENCL = ["opencl"] if backend_available("opencl", torch.device("cpu"))[0] else []
BACKENDS = ["reference", "cpu"] + (["triton"] if triton_backend.interpreted() else []) + OPENCL


# ---------------------------------------------------------------- rope_cache

def _scalar_inv_freq(r, base, scaling):
    """Re-derivation of each rule, one frequency at a time (see cache.py's docstring)."""
    kind = None if scaling is None else scaling["type"]
    out, m = [], 1.0
    for i in range(r // 2):
        b = base * scaling["factor"] ** (r / (r - 2)) if kind == "ntk" else base
        f = 1.0 / b ** (2 * i / r)
        if kind == "linear":
            f /= scaling["factor"]
        elif kind == "llama3":
            fac, orig = scaling["factor"], scaling["original_max_position_embeddings"]
            lo, hi = scaling["low_freq_factor"], scaling["high_freq_factor"]
            wavelen = 2 * math.pi / f
            if wavelen < orig / hi:
                pass                                   # high frequency: unchanged
            elif wavelen > orig / lo:
                f /= fac                               # low frequency: interpolated
            else:
                smooth = (orig / wavelen - lo) / (hi - lo)
                f = (1 - smooth) * f / fac + smooth * f
        elif kind == "yarn":
            fac, orig = scaling["factor"], scaling["original_max_position_embeddings"]
            bf, bs = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

            def corr(n):
                return r * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(base))
            low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), r - 1)
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            keep = 1 - ramp                            # extrapolation weight
            f = f / fac * (1 - keep) + f * keep
            m = 0.1 * math.log(fac) + 1.0
        out.append(f)
    return out, m


SCALINGS = [
    None,
    {"type": "linear", "factor": 4.0},
    {"type": "ntk", "factor": 8.0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 2048, "beta_fast": 16, "beta_slow": 2},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: "none" if s is None else s["type"])
@pytest.mark.parametrize("r,base", [(128, 500000.0), (64, 10000.0), (32, 10000.0)])
def test_rope_cache_rules(scaling, r, base):
    P = 300
    cos, sin = tessera.rope_cache(P, r, base=base, scaling=scaling, dtype=torch.float64)
    assert cos.shape == sin.shape == (P, r // 2) and cos.dtype == torch.float64
    freqs, m = _scalar_inv_freq(r, base, scaling)
    for p in (0, 1, 7, 128, P - 1):
        want_c = torch.tensor([m * math.cos(p * f) for f in freqs], dtype=torch.float64)
        want_s = torch.tensor([m * math.sin(p * f) for f in freqs], dtype=torch.float64)
        torch.testing.assert_close(cos[p], want_c, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(sin[p], want_s, rtol=1e-12, atol=1e-12)


def test_rope_cache_llama3_regions():
    """Llama 3.1 (8B settings): the highest frequencies are untouched, the lowest divided by 8."""
    sc = SCALINGS[3]
    inv, _ = tessera.ops.rope.cache.inv_freq(128, 500000.0, sc)
    plain, _ = tessera.ops.rope.cache.inv_freq(128, 500000.0, None)
    assert torch.equal(inv[:10], plain[:10])
    torch.testing.assert_close(inv[-10:], plain[-10:] / 8, rtol=1e-15, atol=0)
    mid = (inv < plain) & (inv > plain / 8)
    assert mid.any(), "the smooth band between the two wavelength limits is empty"


def test_rope_cache_dtype_device():
    c64, s64 = tessera.rope_cache(50, 16, dtype=torch.float64)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        c, s = tessera.rope_cache(50, 16, dtype=dt, device="cpu")
        assert c.dtype == s.dtype == dt and c.device.type == "cpu"
        assert torch.equal(c, c64.to(dt)) and torch.equal(s, s64.to(dt))   # float64, cast once


@pytest.mark.parametrize("kw,exc,needle", [
    (dict(max_positions=10, rotary_dim=7), ValueError, "'rotary_dim'=7"),
    (dict(max_positions=10, rotary_dim=0), ValueError, "'rotary_dim'=0"),
    (dict(max_positions=-1, rotary_dim=8), ValueError, "'max_positions'=-1"),
    (dict(max_positions=10.0, rotary_dim=8), TypeError, "'max_positions'"),
    (dict(max_positions=10, rotary_dim=8, base=1.0), ValueError, "'base'"),
    (dict(max_positions=10, rotary_dim=8, scaling="linear"), TypeError, "'scaling'"),
    (dict(max_positions=10, rotary_dim=8, scaling={"type": "magic"}), ValueError, "magic"),
    (dict(max_positions=10, rotary_dim=8, scaling={"type": "linear"}), ValueError, "['factor']"),
    (dict(max_positions=10, rotary_dim=8, scaling={"type": "linear", "factor": -2}), ValueError, "'factor'"),
    (dict(max_positions=10, rotary_dim=8, scaling={"type": "ntk", "factor": 2, "beta": 1}), ValueError, "beta"),
    (dict(max_positions=10, rotary_dim=8, scaling={**SCALINGS[3], "high_freq_factor": 0.5}), ValueError,
     "high_freq_factor"),
    (dict(max_positions=10, rotary_dim=8, dtype=torch.int32), TypeError, "'dtype'"),
])
def test_rope_cache_errors(kw, exc, needle):
    with pytest.raises(exc) as info:
        tessera.rope_cache(**kw)
    assert "rope_cache" in str(info.value) and needle in str(info.value), str(info.value)


# ---------------------------------------------------------------- rope: errors

def _qkcs(B=2, S=5, Hq=4, Hk=2, D=16, P=8, r=None):
    q, k = torch.randn(B, S, Hq, D), torch.randn(B, S, Hk, D)
    cos, sin = tessera.rope_cache(P, r or D)
    return q, k, cos, sin


@pytest.mark.parametrize("backend", ["cpu", "reference"] + OPENCL)
@pytest.mark.parametrize("make,exc,needles", [
    (lambda q, k, c, s: dict(position_ids=torch.full((2, 5), 8)), ValueError, ["'position_ids'", "holds 8", "8)"]),
    (lambda q, k, c, s: dict(position_ids=torch.tensor([0, 1, -1, 2, 3], dtype=torch.int32)), ValueError,
     ["'position_ids'", "-1"]),
    (lambda q, k, c, s: dict(position_ids=torch.zeros(2, 5)), TypeError, ["'position_ids'", "float32"]),
    (lambda q, k, c, s: dict(position_ids=torch.zeros(2, 4, dtype=torch.long)), ValueError,
     ["'position_ids'", "(2, 4)", "(2, 5)"]),
    (lambda q, k, c, s: dict(position_ids=[0, 1, 2, 3, 4]), TypeError, ["'position_ids'", "list"]),
    (lambda q, k, c, s: dict(q=q[0], k=k[0]), ValueError, ["'position_ids'", "required"]),
    (lambda q, k, c, s: dict(q=torch.randn(2, 5, 4, 15), k=torch.randn(2, 5, 2, 15)), ValueError,
     ["rotary_dim=None", "head_dim=15"]),
    (lambda q, k, c, s: dict(rotary_dim=18), ValueError, ["rotary_dim=18"]),
    (lambda q, k, c, s: dict(rotary_dim=7), ValueError, ["rotary_dim=7"]),
    (lambda q, k, c, s: dict(rotary_dim=8), ValueError, ["'cos'", "= 4"]),
    (lambda q, k, c, s: dict(rotary_dim=True), TypeError, ["'rotary_dim'", "bool"]),
    (lambda q, k, c, s: dict(interleaved=1), TypeError, ["'interleaved'", "int"]),
    (lambda q, k, c, s: dict(cos=torch.cat([c, c], -1), sin=torch.cat([s, s], -1)), ValueError,
     ["'cos'", "cos[:, :8]"]),
    (lambda q, k, c, s: dict(cos=c.half(), sin=s.half()), TypeError, ["'cos'", "float16"]),
    (lambda q, k, c, s: dict(sin=s[:4]), ValueError, ["'sin'", "(4, 8)"]),
    (lambda q, k, c, s: dict(q=torch.randn(2, 9, 4, 16), k=torch.randn(2, 9, 2, 16)), ValueError,
     ["seq=9", "max_positions=8"]),
    (lambda q, k, c, s: dict(k=torch.randn(2, 5, 16)), ValueError, ["'k'", "(2, 5, 16)"]),
])
def test_rope_errors(make, exc, needles, backend):
    q, k, cos, sin = _qkcs()
    kw = dict(q=q, k=k, cos=cos, sin=sin)
    kw.update(make(q, k, cos, sin))
    with pytest.raises(exc) as info:
        tessera.rope(**kw, backend=backend)
    msg = str(info.value)
    assert "tessera.rope" in msg
    for n in needles:
        assert n in msg, f"{msg!r} lacks {n!r}"


def test_cpu_kernel_checks_positions_itself():
    """The kernel does not rely on the host check: a bad id is an error, never a wild read."""
    from tessera.ops.rope import cpu as rope_cpu
    q, k, cos, sin = _qkcs()
    pos = torch.tensor([[0, 1, 2, 3, 1 << 40]] * 2)
    assert rope_cpu.CHECKS_POSITIONS  # (so the op skips its host check on cpu: this is the only one)
    with pytest.raises(ValueError, match=f"'position_ids' holds {1 << 40}"):
        rope_cpu.forward(q, k, cos, sin, pos, False, 16)


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
@pytest.mark.parametrize("bad", [-1, 8, 1 << 40])
@pytest.mark.parametrize("interleaved", [False, True])
def test_opencl_kernel_checks_positions_itself(bad, interleaved):
    """As the cpu kernel: an id outside [0, P) (int32 and int64 ids) is an error raised from the
    kernel's own check, and the table rows of valid ids are still right."""
    from tessera.ops.rope import opencl as rope_ocl
    q, k, cos, sin = _qkcs()
    for dt in (torch.int64, torch.int32):
        if dt == torch.int32 and bad == 1 << 40:
            continue
        pos = torch.tensor([[0, 1, 2, 3, bad]] * 2, dtype=dt)
        with pytest.raises(ValueError, match="position id"):
            rope_ocl.forward(q, k, cos, sin, pos, interleaved, 16)
    good = torch.tensor([[0, 1, 2, 3, 7]] * 2)
    qo, ko = rope_ocl.forward(q, k, cos, sin, good, interleaved, 16)
    rq, rk = SPEC.ref(q=q, k=k, cos=cos, sin=sin, position_ids=good, interleaved=interleaved)
    torch.testing.assert_close(qo, rq.float(), rtol=1.3e-6, atol=1e-5)
    torch.testing.assert_close(ko, rk.float(), rtol=1.3e-6, atol=1e-5)


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_opencl_local_size_does_not_change_outputs(dtype, monkeypatch):
    """The opencl launcher picks one work-item per token on a CPU device and up to 256 on a GPU;
    each work-item owns whole (head, chunk) units, so any work-group size gives the same bits
    (half-split, interleaved, partial rotary and a partial last chunk, GQA, strided views)."""
    from tessera.backends import opencl as cl
    names = ["7tok-hd80-gqa", "2x17-hd80-interleaved-gqa", "7tok-hd96-r64-interleaved", "17tok-hd66-r2",
             "qkv-1x17-hd96-r64-pos", "2x17-pos-repeated-int32"]
    for name in names:
        kw = _case(name).make(dtype, torch.device("cpu"), torch.Generator().manual_seed(1))
        outs = []
        for L in (1, 4, 32, 256):
            monkeypatch.setattr(cl, "vec_local_size", lambda n, L=L: L)
            outs.append(tessera.rope(**kw, backend="opencl"))
        for qo, ko in outs[1:]:
            assert torch.equal(qo, outs[0][0]) and torch.equal(ko, outs[0][1]), name


# ---------------------------------------------------------------- rope: properties

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_identity_at_position_zero(backend, dtype, interleaved):
    q, k, cos, sin = _qkcs(D=48, r=32)
    q, k = q.to(dtype), k.to(dtype)
    pos = torch.zeros(2, 5, dtype=torch.int32)
    qo, ko = tessera.rope(q, k, cos, sin, pos, interleaved=interleaved, rotary_dim=32, backend=backend)
    assert torch.equal(qo, q) and torch.equal(ko, k)


@pytest.mark.parametrize("backend", BACKENDS)
def test_heads_and_tensors_independent(backend):
    q, k, cos, sin = _qkcs(Hq=6, Hk=2)
    qo, ko = tessera.rope(q, k, cos, sin, backend=backend)
    # every head alone gives the same rows
    for h in (0, 3, 5):
        qh, kh = tessera.rope(q[:, :, h:h + 1], k[:, :, :1], cos, sin, backend=backend)
        assert torch.equal(qh[:, :, 0], qo[:, :, h]) and torch.equal(kh[:, :, 0], ko[:, :, 0])
    # k's result does not depend on q (GQA: other head count, other values), nor q's on k
    qo2, ko2 = tessera.rope(torch.randn(2, 5, 1, 16), k, cos, sin, backend=backend)
    qo3, _ = tessera.rope(q, torch.randn(2, 5, 3, 16), cos, sin, backend=backend)
    assert torch.equal(ko2, ko) and torch.equal(qo3, qo)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("interleaved", [False, True])
def test_inverse_rotation(backend, interleaved):
    """rope(x) rotated back by the negated sin table is x (fp32, to rounding)."""
    q, k, cos, sin = _qkcs(D=24)
    pos = torch.randint(0, 8, (2, 5))
    qo, ko = tessera.rope(q, k, cos, sin, pos, interleaved=interleaved, backend=backend)
    qb, kb = tessera.rope(qo, ko, cos, -sin, pos, interleaved=interleaved, backend=backend)
    torch.testing.assert_close(qb, q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kb, k, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tables_get_no_gradient(backend):
    q, k, cos, sin = _qkcs()
    q.requires_grad_(True)
    cos.requires_grad_(True)
    qo, ko = tessera.rope(q, k, cos, sin, backend=backend)
    (qo.sum() + ko.sum()).backward()
    assert q.grad is not None and cos.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_broadcast_and_big_stride_views(backend, dtype):
    """Stride-0 (expanded) inputs and a large head stride take the strided path; vs the reference."""
    base = torch.randn(1, 1, 1, 32, dtype=torch.float64)

    def make(dt, device, gen):
        q = base.to(dt).expand(3, 4, 2, 32)
        wide = torch.randn(3, 4, 2, 4096, generator=gen, dtype=torch.float64).to(dt)
        return {"q": q, "k": wide[..., 100:132], "cos": tessera.rope_cache(9, 32)[0],
                "sin": tessera.rope_cache(9, 32)[1], "position_ids": torch.arange(4) + 3}

    r = run_case(SPEC, backend, dtype, Case("broadcast", make))
    assert r.ok, r.why


# ---------------------------------------------------------------- compile / opcheck with ids

def _case(name):
    return next(c for c in SPEC.cases if c.name == name)


@pytest.mark.parametrize("name", ["2x17-pos-repeated-int32", "packed-23tok-varlen", "qkv-2x7-hd64-gqa"])
def test_opcheck_position_ids(name):
    kw = _case(name).make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    args = (kw["q"].detach().requires_grad_(True), kw["k"].detach().requires_grad_(True), kw["cos"], kw["sin"],
            kw.get("position_ids"), kw.get("interleaved", False), kw.get("rotary_dim") or -1, "cpu")
    res = torch.library.opcheck(torch.ops.tessera.rope.default, args)
    assert all(v == "SUCCESS" for v in res.values()), res


def test_compile_with_position_ids():
    torch._dynamo.reset()
    kw = _case("2x17-pos-random").make(torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))

    def f(q, k, cos, sin, position_ids):
        qo, ko = tessera.rope(q, k, cos, sin, position_ids, interleaved=True, backend="cpu")
        return (qo * 2).sum() + ko.sum()

    q = kw["q"].clone().requires_grad_(True)
    want = f(q, kw["k"], kw["cos"], kw["sin"], kw["position_ids"])
    (gq_want,) = torch.autograd.grad(want, q)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, kw["k"], kw["cos"], kw["sin"],
                                                                 kw["position_ids"])
    (gq,) = torch.autograd.grad(got, q)
    assert torch.equal(got, want) and torch.equal(gq, gq_want)


# ---------------------------------------------------------------- fuzz (cpu vs float64 reference)

@st.composite
def _fuzz_case(draw):
    B, S = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    Hk = draw(st.integers(1, 3))
    Hq = Hk * draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 80))
    r = 2 * draw(st.integers(1, D // 2))
    pos = draw(st.sampled_from([None, "random", "repeated", "descending", "row"]))
    layout = draw(st.sampled_from(["contig", "qkv", "bhsd"] + (["packed"] if pos == "random" else [])))
    dtype = draw(st.sampled_from(SPEC.dtypes))
    case = rope_cases.build(f"fuzz-{B}x{S}-{Hq}/{Hk}-D{D}-r{r}-{pos}-{layout}", B, S, Hq, Hk, D,
                            r=None if r == D else r, interleaved=draw(st.booleans()), pos=pos, layout=layout,
                            cs=draw(st.sampled_from(["fp32", "input"])), P=S + 5 + draw(st.integers(0, 20)))
    return dtype, case


@settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=_fuzz_case())
def test_fuzz_cpu_vs_reference(drawn):
    dtype, case = drawn
    r = run_case(SPEC, "cpu", dtype, case)
    assert r.ok, f"{case.name} {dtype}: {r.why}"


@pytest.mark.skipif(not OPENCL, reason="no OpenCL device")
@settings(max_examples=int(os.environ.get("TESSERA_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=_fuzz_case())
def test_fuzz_opencl_vs_reference(drawn):
    dtype, case = drawn
    r = run_case(SPEC, "opencl", dtype, case)
    assert r.ok, f"{case.name} {dtype}: {r.why}"


# ---------------------------------------------------------------- nn.RotaryEmbedding

def test_rotary_embedding_module():
    m = tessera.nn.RotaryEmbedding(32, max_positions=64, scaling={"type": "linear", "factor": 2.0})
    assert m.cos.shape == (64, 16) and "cos" not in m.state_dict()
    q, k = torch.randn(2, 9, 4, 48), torch.randn(2, 9, 2, 48)
    pos = torch.randint(0, 64, (2, 9))
    want = tessera.rope(q, k, m.cos, m.sin, pos, rotary_dim=32)
    got = m(q, k, pos)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    c, s = tessera.rope_cache(64, 32, scaling={"type": "linear", "factor": 2.0})
    assert torch.equal(m.cos, c) and torch.equal(m.sin, s)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_finite_inputs_follow_the_formula(backend, dtype):
    """inf/NaN inputs give what the formula gives in float64 (the fp32 kernels' compensation term
    must not turn inf into NaN)."""
    q, k, cos, sin = _qkcs(B=1, S=6, Hq=2, Hk=1, D=32)
    q[0, 1, 0, 3], q[0, 2, 1, 20], q[0, 3, 0, 5] = float("inf"), -float("inf"), float("nan")
    k[0, 4, 0, 0] = float("inf")
    q, k = q.to(dtype), k.to(dtype)
    qo, ko = tessera.rope(q, k, cos, sin, backend=backend)
    rq, rk = SPEC.ref(q=q.double(), k=k.double(), cos=cos, sin=sin)
    for o, r in ((qo, rq), (ko, rk)):
        r = r.to(dtype)
        assert torch.equal(torch.isnan(o), torch.isnan(r))
        assert torch.equal(torch.isinf(o), torch.isinf(r)) and torch.equal(o[torch.isinf(o)], r[torch.isinf(r)])
