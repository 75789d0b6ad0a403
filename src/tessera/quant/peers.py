"""Other libraries' quantized CPU GEMMs, as ``OpSpec.peers`` factories for ``tessera bench``.

Each factory takes the kwargs of a tessera quantized linear (``x``, ``weight``,
``weight_scale``, ``weight_zero``, ``group_size``; layouts in ``tessera.quant.contract`` and
the linear ops' docstrings), converts the weight to the peer's own format ONCE (outside the
timed loop) and returns a no-arg callable computing the same product -- or a string saying
why the peer cannot run this row (the bench records it as the peer's error).

* ``torch_int8pack``  -- ``aten._weight_int8pack_mm``: int8 per-channel weight x float
  activation (weight-only int8; torch's CPU kernel behind torchao's int8 weight-only).
* ``torch_int4pack``  -- ``aten._weight_int4pack_mm_for_cpu``: torch's tinygemm-style int4
  (float zero point: w = (q - 8) * s + zp_f, so tessera's integer zero z maps to
  zp_f = (8 - z) * s, which is exact up to one fp32 rounding).
* ``ort_matmulnbits`` / ``ort_matmulnbits_a8`` -- ONNX Runtime's ``com.microsoft.MatMulNBits``
  (4 bits, block = group_size): float activations (accuracy_level 0) and activations
  quantized to int8 inside ORT (accuracy_level 4, its fastest CPU path; the peer of W4A8).
  Optional: needs ``pip install onnxruntime onnx`` (the ``bench`` extra installs them).
  ORT's B layout [N, K/block, block/2] with low nibble = even k is tessera's packed
  [N, K/2] reshaped; its default zero point (8) is tessera's symmetric int4.
* ``dequant_matmul`` (``dequant_matmul_int8`` / ``_int4`` / ``_fp8``) -- the baseline a user
  actually runs: the weight dequantized ONCE (here, outside the timed loop) to x's dtype, then
  ``F.linear`` (oneDNN) and the activation.  The eager column dequantizes on every call.

None of the peers fuses tessera's epilogue, so each adds ``bias`` and the activation after its
GEMM in x's dtype (a few us at decode): every peer computes the whole op, and
``tests/test_bench_peers.py`` checks each against the float64 reference of what it computes
(weight-only peers against x @ dequant(w).T, whatever the op quantizes in its activations).
"""
from __future__ import annotations

import torch

from .contract import unpack_int4


def _x2d(kw):
    x = kw["x"]
    return x.reshape(-1, x.shape[-1])


def _shape_back(kw, y):
    return y.reshape(*kw["x"].shape[:-1], y.shape[-1])


def _epilogue(kw, y):
    """bias + activation after a peer's GEMM (in y's dtype), then x's leading dims back."""
    from ..ops._qlinear_int8.ref import activate
    b = kw.get("bias")
    if b is not None:
        y = y + b.to(y.dtype)
    return _shape_back(kw, activate(y, kw.get("activation")))


def torch_int8pack(kw):
    x, w, s = _x2d(kw), kw["weight"], kw["weight_scale"]
    if w.dtype != torch.int8:
        return f"torch int8pack needs an int8 weight, got {w.dtype}"
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"torch int8pack has no {x.dtype} activations"
    s = s.float().expand(w.shape[0]).to(x.dtype).contiguous()  # its scales must be x's dtype
    x, w = x.contiguous(), w.contiguous()
    return lambda: _epilogue(kw, torch.ops.aten._weight_int8pack_mm(x, w, s))


def torch_int4pack(kw):
    x, w, s, z, g = _x2d(kw), kw["weight"], kw["weight_scale"], kw.get("weight_zero"), kw["group_size"]
    if w.dtype != torch.uint8:
        return f"torch int4pack needs tessera's packed uint8 int4 weight, got {w.dtype}"
    codes = unpack_int4(w).to(torch.int32)
    N, K = codes.shape
    if K % 64 or N % 16:
        return f"torch int4pack needs K % 64 == 0 and N % 16 == 0 (K={K}, N={N})"
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
    zf = torch.zeros_like(s) if z is None else (8.0 - z.float()) * s
    sz = torch.stack([s.float(), zf], -1).transpose(0, 1).contiguous().to(x.dtype)  # [K/g, N, 2]
    x = x.contiguous()
    return lambda: _epilogue(kw, torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, g, sz))


def _ort_session(kw, accuracy_level: int):
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return "onnxruntime/onnx not installed (pip install onnxruntime onnx)"
    x, w, s, z, g = _x2d(kw), kw["weight"], kw["weight_scale"], kw.get("weight_zero"), kw["group_size"]
    if w.dtype != torch.uint8:
        return f"MatMulNBits needs tessera's packed uint8 int4 weight, got {w.dtype}"
    if x.dtype != torch.float32:
        return f"ORT's CPU MatMulNBits runs fp32 (and fp16) activations, not {x.dtype}"
    N, K = w.shape[0], w.shape[1] * 2
    kb = K // g
    inits = [numpy_helper.from_array(w.reshape(N, kb, g // 2).contiguous().numpy(), "B"),
             numpy_helper.from_array(s.float().reshape(N * kb).contiguous().numpy(), "scales")]
    inputs = ["A", "B", "scales"]
    if z is not None:  # uint8 zero points, two per byte along the K blocks, low nibble first
        zz = z.to(torch.uint8).reshape(N, kb)
        if kb % 2:
            zz = torch.cat([zz, torch.full((N, 1), 8, dtype=torch.uint8)], 1)
        zp = (zz[:, 0::2] | (zz[:, 1::2] << 4)).contiguous().numpy().reshape(-1)
        inits.append(numpy_helper.from_array(zp, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=g, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "matmulnbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    opts.inter_op_num_threads = 1
    # no spinning: ORT's pool otherwise busy-waits for ms after each call, and a read-bound row
    # builds one session per rotation copy (up to 8 pools): on 2 cores they stole the core from the
    # contenders and the ceiling timed after them (spreads of +-100-500% in 2026-12-04-cpu's first
    # fresh-clone run).  Each sample's untimed first call absorbs the pool's wake-up instead.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    a = np.ascontiguousarray(x.numpy())
    return lambda: _epilogue(kw, torch.from_numpy(sess.run(None, {"A": a})[0]))


def ort_matmulnbits(kw):
    """ORT MatMulNBits with float activations (accuracy_level 0): the W4A16 peer."""
    return _ort_session(kw, 0)


def ort_matmulnbits_a8(kw):
    """ORT MatMulNBits quantizing activations to int8 itself (accuracy_level 4): the W4A8 peer."""
    return _ort_session(kw, 4)


def _dequant_matmul(kw, w_fp32):
    """F.linear(x, w, bias) + activation with ``w_fp32`` [N, K] cast to x's dtype once, here."""
    x = kw["x"]
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"dequant+matmul needs float activations, got {x.dtype}"
    w = w_fp32.to(x.dtype).contiguous()
    b = kw.get("bias")
    b = None if b is None else b.to(x.dtype)
    from ..ops._qlinear_int8.ref import activate
    act = kw.get("activation")
    return lambda: activate(torch.nn.functional.linear(x, w, b), act)


def dequant_matmul_int8(kw):
    """int8 weight [N, K] x per-channel (or per-tensor) scale -> fp32, once."""
    w, s = kw["weight"], kw["weight_scale"].float().reshape(-1)
    return _dequant_matmul(kw, w.float() * s.expand(w.shape[0])[:, None])


def dequant_matmul_int4(kw):
    """packed int4 (q - zero) * scale per group -> fp32, once (the ops' own dequantize_weight)."""
    from ..ops._qlinear_int4 import dequantize_weight
    return _dequant_matmul(kw, dequantize_weight(kw["weight"], kw["weight_scale"], kw.get("weight_zero"),
                                                 kw["group_size"], torch.float32))


def dequant_matmul_fp8(kw):
    """fp8 weight x per-tensor / row / 128x128-block scale -> fp32, once."""
    from ..ops.linear_fp8.ref import dequantize_weight
    return _dequant_matmul(kw, dequantize_weight(kw["weight"], kw["weight_scale"], torch.float32))
