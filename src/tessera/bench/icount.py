"""``tessera bench --target aarch64|riscv64``: dynamic instructions per element of the edge-CPU
kernels, vector build against the portable-C build of the same source.

Emulated time means nothing, so the evidence is instruction counts.  Debian's qemu-user-static
has no plugin support; instead each measurement runs a fresh runner under
``qemu -d in_asm,exec,nochain -D LOG``: each translated block is logged once with its guest
instructions (``IN:``), and each execution of a block (chaining off, so none is skipped) writes a
``Trace`` line with the block's guest address; the sum over executions of the block sizes is the
process's dynamic instruction count (start-up, protocol and the kernel).  (``-singlestep``, one
line per instruction, trips an assertion in qemu 7.2's RISC-V translator.)  Two runs per row, with
N and 2N elements, and the difference divided by N is the kernel's per-element cost: start-up,
the hello, the protocol's fixed work and the per-row overheads of the smaller run cancel; what
stays per element is the kernel (plus the runner's poisoning memset of the outputs, a few
instructions per element in both builds, which understates the ratio slightly).

The portable baseline is the same runner built with the vector unit off (``-march=armv8-a+nosimd``,
``-march=rv64gc``: the kernels' vector-extension code lowers to scalar instructions), i.e. the
portable C path of the same kernel.  RVV rows use ``TESSERA_RVV_VLEN`` (default 256).

The rope and append_kv rows (``q+k`` / ``k+v``) move 4 tokens of n / 128 heads of 128 in each of two
tensors and count per element of both.

The int8 matmul rows (int_mm, linear_w8a8: 4 rows of K = n against N_OUT weight rows) count per
multiply-accumulate (M x N_OUT x K) instead of per element.  On aarch64 each is measured once per
micro-kernel the runner can choose at run time (``TESSERA_QI8_DOT``, _qlinear_int8/cross.py): SMMLA
(FEAT_I8MM), SDOT (FEAT_DotProd) and the plain NEON loops, each against the same portable build.
"""
from __future__ import annotations

import contextlib
import os
import tempfile

import torch

import tessera

from ..backends import cross

# (row name, op call) at a given row length: 4 rows, fp32 unless named
M_ROWS = 4
N_OUT = 32      # weight rows of the int8 matmul rows
HEAD_DIM = 128  # rope / append_kv rows: heads of 128
# rows that touch two tensors of M_ROWS x n each (rope: q and k; append_kv: k and v), counted per element of both
TWO_TENSOR_ROWS = ("rope fwd fp32 q+k", "append_kv fp32->fp16 k+v", "append_kv fp32->int8 k+v")
# the int8 matmul rows, counted per multiply-accumulate; on aarch64 once per micro-kernel:
# row suffix -> TESSERA_QI8_DOT
MATMUL_ROWS = ("int_mm int8 /MAC", "linear_w8a8 /MAC")
AARCH64_DOT = {"SMMLA": "", "SDOT": "sdot", "NEON": "0"}


def _workloads():
    g = torch.Generator().manual_seed(0)

    def x(n, dtype=torch.float32):
        return torch.randn(M_ROWS, n, generator=g).to(dtype)

    def heads(n):   # (batch 1, M_ROWS tokens, n / HEAD_DIM heads, HEAD_DIM)
        return torch.randn(1, M_ROWS, n // HEAD_DIM, HEAD_DIM, generator=g)

    def append(b, n, cache_dtype):
        cache = (1, M_ROWS, n // HEAD_DIM, HEAD_DIM)     # one page of M_ROWS slots
        kc, vc = torch.zeros(cache, dtype=cache_dtype), torch.zeros(cache, dtype=cache_dtype)
        q8 = cache_dtype == torch.int8
        ks = torch.zeros(cache[:3]) if q8 else None
        vs = torch.zeros(cache[:3]) if q8 else None
        return tessera.append_kv(heads(n), heads(n), kc, vc, torch.zeros(1, 1, dtype=torch.int32),
                                 torch.zeros(1, dtype=torch.int32), ks, vs, backend=b)

    return {
        "rms_norm fwd fp32": lambda b, n: tessera.rms_norm(x(n), torch.rand(n, generator=g) + 0.5, backend=b),
        "rms_norm fwd fp16": lambda b, n: tessera.rms_norm(x(n, torch.float16), torch.rand(n, generator=g) + 0.5,
                                                           backend=b),
        "layer_norm fwd fp32": lambda b, n: tessera.layer_norm(x(n), torch.rand(n, generator=g) + 0.5,
                                                               torch.randn(n, generator=g), backend=b),
        "softmax fwd fp32": lambda b, n: tessera.softmax(x(n), backend=b),
        "silu fwd fp32": lambda b, n: tessera.silu(x(n), backend=b),
        "gelu fwd fp32": lambda b, n: tessera.gelu(x(n), backend=b),
        "swiglu fwd bf16": lambda b, n: tessera.swiglu(x(n, torch.bfloat16), x(n, torch.bfloat16), backend=b),
        "geglu fwd bf16": lambda b, n: tessera.geglu(x(n, torch.bfloat16), x(n, torch.bfloat16), backend=b),
        # q and k: M_ROWS tokens x n / HEAD_DIM heads x HEAD_DIM, rotated half by half (counted per q and k element)
        "rope fwd fp32 q+k": lambda b, n: tessera.rope(
            heads(n), heads(n), torch.randn(M_ROWS, HEAD_DIM // 2, generator=g),
            torch.randn(M_ROWS, HEAD_DIM // 2, generator=g), backend=b),
        # M_ROWS new tokens of n / HEAD_DIM heads into one page (per k and v element)
        "append_kv fp32->fp16 k+v": lambda b, n: append(b, n, torch.float16),
        "append_kv fp32->int8 k+v": lambda b, n: append(b, n, torch.int8),
        "quantize int8 fp32": lambda b, n: tessera.quantize_blocks(x(n), "int8", block_rows=1, block=0, backend=b),
        "quantize int4 g32 fp32": lambda b, n: tessera.quantize_blocks(x(n), "int4", block_rows=1, block=32,
                                                                       backend=b),
        "dequantize int8->fp32": lambda b, n: tessera.dequantize_blocks(
            torch.randint(-127, 128, (M_ROWS, n), generator=g, dtype=torch.int8), torch.rand(M_ROWS, generator=g),
            None, block_rows=1, block=0, dtype=torch.float32, backend=b),
        "int_mm int8 /MAC": lambda b, n: tessera.int_mm(
            torch.randint(-128, 128, (M_ROWS, n), generator=g, dtype=torch.int8),
            torch.randint(-128, 128, (N_OUT, n), generator=g, dtype=torch.int8), backend=b),
        "linear_w8a8 /MAC": lambda b, n: tessera.linear_w8a8(
            x(n), torch.randint(-127, 128, (N_OUT, n), generator=g, dtype=torch.int8),
            torch.rand(N_OUT, generator=g) + 0.5, backend=b),
    }


@contextlib.contextmanager
def _setenv(name: str, value):
    """``name=value`` for the block (None: left as it is)."""
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old


def _rows(target: str):
    """(row name, workload, TESSERA_QI8_DOT or None, elements per unit of n)"""
    for op, run in _workloads().items():
        per = M_ROWS * (N_OUT if op in MATMUL_ROWS else 2 if op in TWO_TENSOR_ROWS else 1)
        if op in MATMUL_ROWS and target == "aarch64":
            for kern, knob in AARCH64_DOT.items():
                yield f"{op} {kern}", op, run, knob, per
        else:
            yield op, op, run, None, per


def _count(name: str, portable: bool, run, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "exec.log")
        r = cross.Runner(name, portable=portable, qemu_extra=("-d", "in_asm,exec,nochain", "-D", log))
        key = cross._key(name)
        old = cross._runners.get(key)
        cross._runners[key] = r
        try:
            run(name, n)
        finally:
            r.close()
            if old is None:
                cross._runners.pop(key, None)
            else:
                cross._runners[key] = old
        return _dynamic_instructions(log)


def _dynamic_instructions(log: str) -> int:
    size: dict[int, int] = {}     # guest pc of a block -> instructions in its latest translation
    total, block_pc, n = 0, None, 0
    with open(log, errors="replace") as f:
        for line in f:
            if line.startswith("Trace "):
                pc = int(line.split("[", 1)[1].split("/")[1], 16)
                total += size.get(pc, 1)
            elif line.startswith("IN:"):
                block_pc, n = None, 0
            elif line.startswith("0x") and ":" in line[:20]:
                if block_pc is None:
                    block_pc = int(line.split(":", 1)[0], 16)
                n += 1
                size[block_pc] = n
    return total


def per_element(target: str, n: int = 1024) -> list[dict]:
    """Rows of {op, vector, portable, ratio}: instructions per element at row length n..2n."""
    name = f"cpu:{target}"
    ok, why = cross.available(name, torch.device("cpu"))
    if not ok:
        raise RuntimeError(why)
    rows, portable_of = [], {}
    for row, op, run, knob, elems in _rows(target):
        per = {}
        for portable in (False, True):
            if portable and op in portable_of:   # one portable build: the same count for every variant
                per[True] = portable_of[op]
                continue
            with _setenv("TESSERA_QI8_DOT", knob):
                a, b = _count(name, portable, run, n), _count(name, portable, run, 2 * n)
            per[portable] = (b - a) / (elems * n)
        portable_of[op] = per[True]
        rows.append({"op": row, "vector": per[False], "portable": per[True], "ratio": per[True] / per[False]})
    return rows


def report(target: str, n: int = 1024) -> str:
    rows = per_element(target, n)
    t = cross.TARGETS[f"cpu:{target}"]
    isa = f"RVV 1.0, VLEN {cross.rvv_vlen()}" if t.arch == "riscv64" else "NEON (Armv8.0)"
    out = [f"dynamic instructions per element, {target} ({isa}) vs portable C (vector unit off); "
           f"{M_ROWS} rows x {n}..{2 * n}, qemu in_asm+exec trace",
           f"{'op':<34}{'vector':>10}{'portable':>10}{'ratio':>8}"]
    for r in rows:
        out.append(f"{r['op']:<34}{r['vector']:>10.3f}{r['portable']:>10.3f}{r['ratio']:>7.1f}x")
    out.append(f"(/MAC rows: per multiply-accumulate, {M_ROWS} x {N_OUT} outputs; aarch64 SMMLA / SDOT / NEON: "
               f"the int8 micro-kernel the runner chose, TESSERA_QI8_DOT)")
    return "\n".join(out)
