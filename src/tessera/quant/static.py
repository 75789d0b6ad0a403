"""Static (calibrated) integer quantization of CNNs: the ``int8-static`` and ``a16w8-static`` recipes.

    qmodel = tessera.quantize(model, "int8-static", calibration=[x0, x1, x2])

``calibration`` is an iterable of input batches (tensors), run once through the float model.
The steps (:func:`quantize_static`):

1. the model is deep-copied (the float model is left untouched) and put in eval mode;
   ``tessera.fold_batchnorm`` folds every Conv2d + BatchNorm2d pair;
2. the copy is traced with ``torch.fx`` (Conv2d / Linear and every ``torch.nn`` module are leaves);
3. calibration: observers record the min / max of every value of the graph over all batches;
4. every ``nn.Conv2d`` / ``nn.Linear`` node becomes a :class:`StaticQuantConv2d` /
   :class:`StaticQuantLinear` computed by ``tessera.conv2d_int8`` / ``tessera.linear_int8_requant``;
   a ReLU / ReLU6 that is the only user of the layer's output is fused into the requantization's
   clamp range (qmin = zero point, qmax = the code of 6.0);
5. the residual adds of two integer values become :class:`StaticQuantAdd` (``tessera.add_int8``,
   TFLite's quantized ADD, requantized to the calibrated range of the sum; a ReLU / ReLU6 that is
   the sum's only user is fused into its clamp as for the layers);
6. :class:`StaticQuantModel` runs the graph: values produced by an integer layer or add stay
   integer (int8 / int16 codes plus their scale and zero point) into the next integer layer -- and
   through max-pooling, flatten / reshape, ReLU and Identity / Dropout, which act on the codes
   exactly; any other op (average pooling, an unsupported layer, an add with a float operand) reads
   dequantized floats, and the next integer layer quantizes its float input with the range
   calibrated for it.  The model's input is quantized at the first layer and its output dequantized.

Quantization parameters:

================  ============================================  =====================================
recipe            activations (per tensor, calibrated)           weights (per output channel)
================  ============================================  =====================================
``int8-static``   int8 asymmetric: scale = (max - min) / 255,   int8 symmetric: scale = absmax / 127;
                  zero point = rint(-128 - min / scale), with    bias int32 = rint(b / (s_in s_w));
                  min <= 0 <= max (0 is exact); min / max:       int32 accumulation, TFLite "double"
                  the extremes over all calibration batches      rounding requantization
``a16w8-static``  int16 symmetric: scale = absmax / 32767,       int8 as above; bias int64;
                  zero point 0                                   int64 accumulation (TFLite / CMSIS-NN
                                                                 s16), "single" rounding
================  ============================================  =====================================

Each integer layer requantizes straight to the calibrated range of its output value with the
per-channel Q31 multiplier ``s_in * s_w[o] / s_out`` (``tessera.requantize``'s formulas).
Min / max (not a percentile) ranges: the networks here have no outlier activations after BN
folding, and clipping a ReLU6 / residual range trades rounding error for saturation error that
shows up as top-1 flips; a percentile observer is a drop-in replacement of :class:`MinMaxObserver`.

The residual add (ResNet, MobileNetV2) is integer end to end, as on a DSP or NPU: each operand is
rescaled to 2 max(s_a, s_b) / 2^20 (2^15 for int16) with two fixed-point roundings, the int32 sum
requantized to the output's scale (``tessera.quant.add_int8_params``, TFLite's Prepare).  It was
computed in float on dequantized operands before (one rounding instead of three, and 2.2 ms of a
batch-1 ResNet-18's 11.4 in dequantize / add / quantize passes).  Layers without an integer kernel (a Conv2d with a
fused SiLU / GELU or a non-zeros padding mode, BatchNorm not following a conv, any other module
with parameters) run in float and are listed in the report's ``skipped`` with the reason (and
logged as a warning).
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import operator
from typing import Optional

import torch
import torch.fx as fx
from torch import nn

from ..nn.conv import fold_batchnorm
from ..ops.add_int8 import add_int8
from ..ops.conv2d_int8 import conv2d_int8
from ..ops.linear_int8_requant import linear_int8_requant
from ..ops.max_pool2d_int8 import max_pool2d_int8
from . import contract

_log = logging.getLogger("tessera")


@dataclasses.dataclass(frozen=True)
class StaticRecipe:
    name: str
    act_dtype: torch.dtype        # activation codes
    symmetric: bool               # activations: zero point 0, -QMAX..QMAX
    doc: str = ""

    @property
    def qrange(self) -> tuple[int, int]:
        return (-32767, 32767) if self.act_dtype == torch.int16 else (-128, 127)


STATIC_RECIPES: dict[str, StaticRecipe] = {r.name: r for r in (
    StaticRecipe("int8-static", torch.int8, False,
                 "int8 asymmetric calibrated activations, int8 per-channel weights, int32 accumulation"),
    StaticRecipe("a16w8-static", torch.int16, True,
                 "int16 symmetric calibrated activations, int8 per-channel weights, int64 accumulation"),
)}


# ---------------------------------------------------------------- quantization parameters

class MinMaxObserver:
    """Running min / max of a value over the calibration batches (NaN ignored)."""

    def __init__(self):
        self.lo, self.hi, self.n = math.inf, -math.inf, 0

    def __call__(self, t: torch.Tensor) -> None:
        if not t.is_floating_point() or t.numel() == 0:
            return
        t = contract.nan_to_zero(t.detach().float())
        self.lo, self.hi = min(self.lo, float(t.min())), max(self.hi, float(t.max()))
        self.n += 1


@dataclasses.dataclass(frozen=True)
class QParams:
    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: torch.dtype

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """float -> codes: rint(x / scale) + zero_point saturated (the contract's rounding; NaN -> 0)."""
        # one new fp32 tensor, then in place (the same steps as the contract's formula, bit for bit):
        # seven passes and three allocations were ~1 ms of a batch-1 int8 MobileNetV2 (12 calls)
        q = x.float() / self.scale
        q.nan_to_num_(nan=0.0, posinf=math.inf, neginf=-math.inf)
        return q.round_().add_(self.zero_point).clamp_(self.qmin, self.qmax).to(self.dtype)

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        return q.float().sub_(self.zero_point).mul_(self.scale)


def act_qparams(recipe: StaticRecipe, lo: float, hi: float) -> QParams:
    """The recipe's activation parameters for a calibrated range [lo, hi] (module docstring)."""
    qmin, qmax = recipe.qrange
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"tessera.quantize: a calibrated activation range is not finite: [{lo}, {hi}]")
    if recipe.symmetric:
        scale = float(torch.tensor(max(-lo, hi, contract.EPS), dtype=torch.float32) / qmax)
        return QParams(scale, 0, -qmax, qmax, recipe.act_dtype)
    scale = float(torch.tensor(max(hi - lo, contract.EPS), dtype=torch.float32) / (qmax - qmin))
    zp = int(min(max(round(qmin - lo / scale), qmin), qmax))
    return QParams(scale, zp, qmin, qmax, recipe.act_dtype)


def quantize_multiplier(real: torch.Tensor, acc64: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 scales -> (int32 Q31 multiplier, int32 shift) with real = m * 2^(shift - 31)
    (TFLite QuantizeMultiplier); scales below 2^-62 (the smallest shift) round to multiplier 0."""
    mult, shift = [], []
    hi_shift = 7 if acc64 else 30
    for r in real.double().tolist():
        if r <= 0.0:
            mult.append(0), shift.append(0)
            continue
        mant, exp = math.frexp(r)
        q = math.floor(mant * (1 << 31) + 0.5)   # TfLiteRound: half away from zero (Python's round: to even)
        if q == 1 << 31:
            q, exp = q // 2, exp + 1
        if exp < -31:
            q, exp = math.floor(r * 2.0 ** 62 + 0.5), -31
        if exp > hi_shift:
            raise ValueError(f"tessera.quantize: requantization scale {r:g} is too large for the "
                             f"{'int64' if acc64 else 'int32'} path (shift {exp} > {hi_shift})")
        mult.append(min(q, (1 << 31) - 1)), shift.append(exp)
    return torch.tensor(mult, dtype=torch.int32), torch.tensor(shift, dtype=torch.int32)


def add_int8_params(a_scale: float, b_scale: float, out_scale: float, dtype: torch.dtype = torch.int8) -> dict:
    """``tessera.add_int8``'s multipliers, shifts and left shift for operands of float scales
    ``a_scale`` / ``b_scale`` and an output of ``out_scale``, as TFLite's Prepare of ADD derives
    them (float64 arithmetic on the float32 scales): the common scale twice = 2 max(s_a, s_b), the
    reals s_a / twice, s_b / twice and twice / (2^left_shift s_out), each through QuantizeMultiplier
    (``quantize_multiplier``); left_shift 20 for int8, 15 for int16."""
    from ..ops.add_int8 import LEFT_SHIFT
    scales = [float(torch.tensor(v, dtype=torch.float32)) for v in (a_scale, b_scale, out_scale)]
    if not all(math.isfinite(v) and v > 0 for v in scales):
        raise ValueError(f"tessera.quant.add_int8_params: the scales must be finite and > 0, got {scales}")
    if dtype not in LEFT_SHIFT:
        raise TypeError(f"tessera.quant.add_int8_params: argument 'dtype'={dtype} is not supported; "
                        f"expected int8 or int16")
    left = LEFT_SHIFT[dtype]
    twice = 2.0 * max(scales[0], scales[1])
    m, s = quantize_multiplier(torch.tensor([scales[0] / twice, scales[1] / twice,
                                             twice / (2.0 ** left * scales[2])], dtype=torch.float64), False)
    m, s = m.tolist(), s.tolist()
    return {"a_multiplier": m[0], "a_shift": s[0], "b_multiplier": m[1], "b_shift": s[1],
            "out_multiplier": m[2], "out_shift": s[2], "left_shift": left}


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [O, ...] -> (int8 codes, fp32 scale [O]): symmetric absmax / 127 per output channel
    (an all-zero channel gets scale 1 so its bias keeps a sane integer scale)."""
    w2 = w.detach().float().reshape(w.shape[0], -1)
    amax = contract.absmax(w2, -1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = contract.quantize_values(w2, scale[:, None], torch.int8)
    return q.reshape(w.shape).contiguous(), scale


# ---------------------------------------------------------------- the integer layers

class _StaticQuantLayer(nn.Module):
    """Shared state: weight codes, integer bias, multiplier / shift, input and output parameters."""

    def __init__(self, layer: nn.Module, in_q: QParams, out_q: QParams, qmin: int, qmax: int, activation,
                 backend: Optional[str]):
        super().__init__()
        acc64 = in_q.dtype == torch.int16
        wq, ws = quantize_weight_per_channel(layer.weight)
        self.register_buffer("weight", wq)
        self.register_buffer("weight_scale", ws)
        acc_scale = in_q.scale * ws.double()
        if layer.bias is not None:
            b = torch.round(layer.bias.detach().double() / acc_scale)
            lim = 2.0 ** 62 if acc64 else 2.0 ** 31 - 1
            self.register_buffer("bias", b.clamp(-lim, lim).to(torch.int64 if acc64 else torch.int32))
        else:
            self.bias = None
        m, s = quantize_multiplier(acc_scale / out_q.scale, acc64)
        self.register_buffer("multiplier", m)
        self.register_buffer("shift", s)
        self.in_q, self.out_q, self.qmin, self.qmax = in_q, out_q, qmin, qmax
        self.activation, self.backend = activation, backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """float x -> float y (quantize, integer layer, dequantize): the layer on its own.
        Integer x is taken as codes of the layer's input parameters."""
        q = x if not x.is_floating_point() else self.in_q.quantize(x)
        return self.out_q.dequantize(self.forward_codes(q))

    def extra_repr(self) -> str:
        return (f"in=({self.in_q.scale:.4g}, {self.in_q.zero_point}), out=({self.out_q.scale:.4g}, "
                f"{self.out_q.zero_point}), act={self.in_q.dtype}, clamp=[{self.qmin}, {self.qmax}]"
                + (f", fused={self.activation}" if self.activation else ""))


class StaticQuantConv2d(_StaticQuantLayer):
    """A Conv2d (BatchNorm folded, ReLU / ReLU6 fused) as ``tessera.conv2d_int8``: input codes
    with the calibrated input zero point, per-channel int8 weights, requantized to the calibrated
    output range (int8 / int16 codes)."""

    def __init__(self, conv: nn.Conv2d, in_q, out_q, qmin, qmax, activation=None, backend=None):
        super().__init__(conv, in_q, out_q, qmin, qmax, activation, backend)
        self.stride, self.padding = tuple(conv.stride), conv.padding if isinstance(conv.padding, str) \
            else tuple(conv.padding)
        self.dilation, self.groups = tuple(conv.dilation), conv.groups

    def forward_codes(self, q: torch.Tensor) -> torch.Tensor:
        b = self._buffers   # not nn.Module.__getattr__: ~0.5 us a buffer, 200 a MobileNetV2 call
        return conv2d_int8(q, self.in_q.zero_point, b["weight"], b.get("bias"), b["multiplier"], b["shift"],
                           self.out_q.zero_point, self.stride, self.padding, self.dilation, self.groups, self.qmin,
                           self.qmax, out_dtype=self.out_q.dtype, backend=self.backend)


class StaticQuantLinear(_StaticQuantLayer):
    """An nn.Linear (ReLU fused) as ``tessera.linear_int8_requant`` (same parameters as
    :class:`StaticQuantConv2d`)."""

    def forward_codes(self, q: torch.Tensor) -> torch.Tensor:
        b = self._buffers
        return linear_int8_requant(q, self.in_q.zero_point, b["weight"], b.get("bias"), b["multiplier"], b["shift"],
                                   self.out_q.zero_point, self.qmin, self.qmax, out_dtype=self.out_q.dtype,
                                   backend=self.backend)


class StaticQuantAdd(nn.Module):
    """A residual add of two integer values as ``tessera.add_int8``: operand codes of ``a_q`` /
    ``b_q``, requantized to ``out_q`` (clamped to [qmin, qmax]: a fused ReLU / ReLU6)."""

    def __init__(self, a_q: QParams, b_q: QParams, out_q: QParams, qmin: int, qmax: int, activation=None,
                 backend: Optional[str] = None):
        super().__init__()
        self.a_q, self.b_q, self.out_q, self.qmin, self.qmax = a_q, b_q, out_q, qmin, qmax
        self.activation, self.backend = activation, backend
        self.params = add_int8_params(a_q.scale, b_q.scale, out_q.scale, out_q.dtype)

    def forward_codes(self, qa: torch.Tensor, qb: torch.Tensor) -> torch.Tensor:
        p = self.params
        return add_int8(qa, self.a_q.zero_point, p["a_multiplier"], p["a_shift"], qb, self.b_q.zero_point,
                        p["b_multiplier"], p["b_shift"], p["out_multiplier"], p["out_shift"], self.out_q.zero_point,
                        self.qmin, self.qmax, left_shift=p["left_shift"], backend=self.backend)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """float operands -> float sum (quantize, integer add, dequantize); integer ones are codes."""
        qa = a if not a.is_floating_point() else self.a_q.quantize(a)
        qb = b if not b.is_floating_point() else self.b_q.quantize(b)
        return self.out_q.dequantize(self.forward_codes(qa, qb))

    def extra_repr(self) -> str:
        return (f"a=({self.a_q.scale:.4g}, {self.a_q.zero_point}), b=({self.b_q.scale:.4g}, {self.b_q.zero_point}), "
                f"out=({self.out_q.scale:.4g}, {self.out_q.zero_point}), clamp=[{self.qmin}, {self.qmax}]"
                + (f", fused={self.activation}" if self.activation else ""))


# ---------------------------------------------------------------- tracing, calibration, the plan

class _Tracer(fx.Tracer):
    """Leaves: every torch.nn module and every Conv2d / Linear subclass (tessera.nn.Conv2d)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (nn.Conv2d, nn.Linear)) or super().is_leaf_module(m, qualname)


class _Calibrate(fx.Interpreter):
    def __init__(self, gm, observers):
        super().__init__(gm)
        self.observers = observers

    def run_node(self, n):
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            self.observers.setdefault(n.name, MinMaxObserver())(out)
        return out


_RELU_FNS = (torch.relu, torch.nn.functional.relu)
_RELU6_FNS = (torch.nn.functional.relu6,)
# ops exact on integer codes: the output keeps the input's scale and zero point
_CODE_MODULES = (nn.MaxPool2d, nn.Identity, nn.Dropout, nn.Flatten)
_CODE_FUNCTIONS = (torch.flatten, torch.reshape, torch.nn.functional.max_pool2d, torch.nn.functional.dropout)
_CODE_METHODS = ("flatten", "reshape", "view", "contiguous")
_FLOAT_OK = (nn.ReLU, nn.ReLU6, nn.AdaptiveAvgPool2d, nn.AvgPool2d, nn.Softmax, nn.Hardtanh, nn.Sequential)


def _activation_of(gm, n: fx.Node) -> Optional[str]:
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        if type(m) is nn.ReLU:
            return "relu"
        if type(m) is nn.ReLU6:
            return "relu6"
    if n.op == "call_function" and n.target in _RELU_FNS and len(n.args) == 1:
        return "relu"
    if n.op == "call_function" and n.target in _RELU6_FNS and len(n.args) == 1:
        return "relu6"
    if n.op == "call_method" and n.target == "relu" and len(n.args) == 1:
        return "relu"
    return None


def _is_code_op(gm, n: fx.Node) -> bool:
    if n.op == "call_module":
        m = gm.get_submodule(n.target)
        return isinstance(m, _CODE_MODULES) and not getattr(m, "return_indices", False)
    if n.op == "call_function":
        if n.target is torch.nn.functional.max_pool2d and (len(n.args) > 6 or n.kwargs.get("return_indices")):
            return False   # (values, indices): not a tensor of codes
        return n.target in _CODE_FUNCTIONS
    return n.op == "call_method" and n.target in _CODE_METHODS


_ADD_FNS = (operator.add, operator.iadd, torch.add)


def _add_operands(n: fx.Node):
    """(a, b) of an add of two graph values (no alpha, no out=), else None."""
    if n.kwargs or len(n.args) != 2 or not all(isinstance(a, fx.Node) for a in n.args):
        return None
    if (n.op == "call_function" and n.target in _ADD_FNS) or (n.op == "call_method" and n.target in ("add", "add_")):
        return n.args
    return None


class StaticQuantModel(nn.Module):
    """The statically quantized model: the traced graph of the float model, run node by node
    with the integer layers in ``qlayers`` (keyed by graph node name).  Input: float; output:
    float (dequantized).  Built by :func:`quantize_static` (``tessera.quantize``)."""

    def __init__(self, gm: fx.GraphModule, qlayers: dict, steps: list, recipe: str):
        super().__init__()
        self.float_graph = gm       # the float parts (pooling, adds, unsupported layers) and the graph
        self.qlayers = nn.ModuleDict(qlayers)
        self._steps = steps
        self.recipe = recipe
        last: dict = {}          # value name -> the last step reading it (freed after that step)
        for i, (_, n, _) in enumerate(steps):
            for a in n.all_input_nodes:
                last[a.name] = i
        self._free = [[] for _ in steps]
        for name, i in last.items():
            self._free[i].append(name)

    def forward(self, *args):
        env: dict = {}
        placeholders = iter(args)
        gm = self.float_graph
        qlayers = self.qlayers._modules   # plain dict reads: a module attribute costs ~0.5 us

        def val(a, want_float=True):
            v = env[a.name] if isinstance(a, fx.Node) else a
            if want_float and isinstance(v, tuple):   # (codes, QParams) -> float
                v = v[1].dequantize(v[0])
            return v

        def fl(a):
            return fx.node.map_arg(a, lambda n: val(n))

        for i, (kind, n, extra) in enumerate(self._steps):
            if i:
                for name in self._free[i - 1]:
                    env.pop(name, None)
            if kind == "input":
                env[n.name] = next(placeholders)
            elif kind == "qlayer":
                layer = qlayers[n.name]
                v = val(n.args[0], want_float=False)
                if isinstance(v, tuple):
                    q = v[0]
                else:
                    q = _quantize_input(layer, v)
                if q.dim() == 4 and q.shape[1] > 1 and q.stride(1) != 1:
                    # channels-last codes from the first conv on: conv2d_int8 gathers channels-last
                    # rows (an NCHW x costs it a transposing copy in and one out, 1/3 of MobileNetV2's
                    # int8 time) and keeps x's format, so every later layer, pool and add runs
                    # channels-last too
                    q = q.contiguous(memory_format=torch.channels_last)
                env[extra] = (layer.forward_codes(q), layer.out_q)
            elif kind == "qadd":
                layer = qlayers[n.name]
                va, vb = val(n.args[0], want_float=False), val(n.args[1], want_float=False)
                qa = va[0] if isinstance(va, tuple) else layer.a_q.quantize(va)
                qb = vb[0] if isinstance(vb, tuple) else layer.b_q.quantize(vb)
                env[extra] = (layer.forward_codes(qa, qb), layer.out_q)
            elif kind == "alias":        # a fused activation: its value is the layer's output
                pass
            elif kind == "code":         # exact on codes
                v = val(n.args[0], want_float=False)
                if isinstance(v, tuple):
                    env[n.name] = (_run_codes(gm, n, v[0], fl), v[1])
                else:
                    env[n.name] = _run_float(gm, n, fl)
            elif kind == "relu_codes":
                v = val(n.args[0], want_float=False)
                if isinstance(v, tuple):
                    env[n.name] = (v[0].clamp_min(v[1].zero_point), v[1])
                else:
                    env[n.name] = _run_float(gm, n, fl)
            elif kind == "float":
                env[n.name] = _run_float(gm, n, fl)
            elif kind == "output":
                return fl(n.args[0])
        raise RuntimeError("tessera.StaticQuantModel: the graph has no output")  # pragma: no cover


def _quantize_input(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer.in_q.quantize(x)`` for the model's float input; a plain 4-D fp32 cpu tensor of at
    most 64 channels going to a cpu-backend layer takes one native pass that also writes the codes
    channels-last (``_requant.cpu.quantize_channels_last``: the same integers; the torch ops and the
    channels-last copy after them were ~3-5 ms of a batch-8 int8 ResNet-18)."""
    qp = layer.in_q
    if (type(x) is torch.Tensor and x.dim() == 4 and x.dtype == torch.float32 and x.device.type == "cpu"
            and 0 < x.shape[1] <= 64 and x.numel() and layer.backend in (None, "cpu")
            and not torch.compiler.is_compiling() and not x.requires_grad):
        from ..ops._requant.cpu import quantize_channels_last
        return quantize_channels_last(x, qp.scale, qp.zero_point, qp.qmin, qp.qmax, qp.dtype)
    return qp.quantize(x)


def _max_pool_codes(q, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """F.max_pool2d's signature on codes: ``tessera.max_pool2d_int8`` (exact; 0.82 ms of a batch-1
    ResNet-18's 10 went to the float copy, pool and cast it replaces: torch has no int16 max_pool2d,
    its int8 one fails on channels-last input).  Pools returning indices run in float
    (``_is_code_op``)."""
    return max_pool2d_int8(q, kernel_size, stride, padding, dilation, ceil_mode)


def _run_codes(gm, n: fx.Node, q: torch.Tensor, fl):
    """An op exact on integer codes (``_is_code_op``) applied to the codes ``q`` of its first input:
    max commutes with the increasing map code -> value, flatten / reshape move codes."""
    args, kwargs = fl(n.args[1:]), fl(n.kwargs)
    if n.op == "call_method":
        return getattr(q, n.target)(*args, **kwargs)
    if n.op == "call_module":
        mod = gm.get_submodule(n.target)
        if isinstance(mod, (nn.Identity, nn.Dropout)):
            return q
        if isinstance(mod, nn.MaxPool2d):
            return _max_pool_codes(q, mod.kernel_size, mod.stride, mod.padding, mod.dilation, mod.ceil_mode)
        return mod(q)
    if n.target is torch.nn.functional.dropout:
        return q
    if n.target is torch.nn.functional.max_pool2d:
        return _max_pool_codes(q, *args, **kwargs)
    return n.target(q, *args, **kwargs)


def _run_float(gm, n: fx.Node, fl):
    args, kwargs = fl(n.args), fl(n.kwargs)
    if n.op == "call_module":
        return gm.get_submodule(n.target)(*args, **kwargs)
    if n.op == "call_function":
        return n.target(*args, **kwargs)
    if n.op == "call_method":
        return getattr(args[0], n.target)(*args[1:], **kwargs)
    if n.op == "get_attr":
        return _getattr_path(gm, n.target)
    raise RuntimeError(f"tessera.StaticQuantModel: unexpected node {n.op} {n.target}")  # pragma: no cover


def _getattr_path(obj, target: str):
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _check_calibration(calibration) -> list:
    where = "tessera.quantize"
    if calibration is None:
        raise ValueError(f"{where}: static recipes {tuple(STATIC_RECIPES)} need calibration data: pass "
                         f"calibration=[batch, ...] (an iterable of input batches, e.g. a few batches of real inputs)")
    if isinstance(calibration, torch.Tensor):
        raise TypeError(f"{where}: argument 'calibration' must be an iterable of input batches, got one Tensor "
                        f"of shape {tuple(calibration.shape)}; pass [tensor] to calibrate on one batch")
    try:
        batches = list(calibration)
    except TypeError:
        raise TypeError(f"{where}: argument 'calibration' must be an iterable of input batches, got "
                        f"{type(calibration).__name__}") from None
    if not batches:
        raise ValueError(f"{where}: argument 'calibration' is empty; expected at least one input batch")
    for i, b in enumerate(batches):
        items = b if isinstance(b, (tuple, list)) else (b,)
        if not items or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in items):
            raise TypeError(f"{where}: calibration batch {i} must be a float Tensor (or a tuple of the model's "
                            f"float inputs), got {type(b).__name__}")
    return batches


def _unsupported_reason(m: nn.Module) -> Optional[str]:
    if isinstance(m, nn.Conv2d):
        if m.padding_mode != "zeros":
            return f"Conv2d padding_mode={m.padding_mode!r} (only 'zeros' has an integer kernel)"
        if getattr(m, "activation", None) not in (None, "relu", "relu6"):
            return f"Conv2d with a fused {m.activation!r} (no integer form)"
        return None
    if isinstance(m, nn.Linear):
        return None
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return f"{type(m).__name__} not directly after a Conv2d (cannot be folded)"
    if any(True for _ in m.parameters(recurse=False)) or not isinstance(m, _FLOAT_OK + _CODE_MODULES):
        return f"{type(m).__name__} has no static integer kernel"
    return None


def _clamp(out_q: QParams, act) -> tuple[int, int]:
    """The output codes' range with a fused ReLU (from the zero point) / ReLU6 (to the code of 6)."""
    qmin, qmax = out_q.qmin, out_q.qmax
    if act in ("relu", "relu6"):
        qmin = max(qmin, out_q.zero_point)
    if act == "relu6":
        qmax = min(qmax, out_q.zero_point + round(6.0 / out_q.scale))
    return qmin, qmax


def quantize_static(model: nn.Module, recipe, calibration, *, backend: Optional[str] = None, report=None):
    """Statically quantize ``model`` (module docstring) -> (StaticQuantModel, report).  ``report``:
    a ``tessera.quant.model.QuantReport`` to fill (replaced: (name, in, out) of the integer
    layers; skipped: (name, reason) of layers kept in float)."""
    from .model import QuantReport, _storage_bytes, model_bytes

    r = recipe if isinstance(recipe, StaticRecipe) else STATIC_RECIPES[recipe]
    batches = _check_calibration(calibration)
    if report is None:
        report = QuantReport(r.name, bytes_before=model_bytes(model))
    m = copy.deepcopy(model).eval()
    fold_batchnorm(m)
    try:
        graph = _Tracer().trace(m)
    except Exception as e:  # noqa: BLE001  (any tracing failure: say what is needed)
        raise TypeError(f"tessera.quantize: recipe {r.name!r} traces the model with torch.fx and "
                        f"{type(model).__name__} is not traceable ({type(e).__name__}: {e})") from e
    for n in list(graph.nodes):   # folded BatchNorms (Identity) and eval-mode Dropout are no-ops
        if n.op == "call_module" and isinstance(m.get_submodule(n.target), (nn.Identity, nn.Dropout)) \
                and len(n.args) == 1 and not n.kwargs:
            n.replace_all_uses_with(n.args[0])
            graph.erase_node(n)
    gm = fx.GraphModule(m, graph)

    observers: dict = {}
    with torch.no_grad():
        for b in batches:
            _Calibrate(gm, observers).run(*(b if isinstance(b, (tuple, list)) else (b,)))

    def qp(node):
        ob = observers.get(node.name)
        if ob is None or ob.n == 0:
            raise ValueError(f"tessera.quantize: value {node.name!r} was never a float tensor during calibration")
        return act_qparams(r, ob.lo, ob.hi)

    carried: dict = {}   # node name -> QParams of the codes it holds at run time (absent: float)
    absorbed: dict = {}  # fused activation node name -> the layer node's name
    steps, qlayers = [], {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            steps.append(("input", n, None))
            continue
        if n.op == "output":
            steps.append(("output", n, None))
            continue
        if n.name in absorbed:
            steps.append(("alias", n, None))
            continue
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            why = _unsupported_reason(mod)
            if why is not None:
                report.skipped.append((n.target, why + "; computed in float"))
            elif isinstance(mod, (nn.Conv2d, nn.Linear)) and len(n.args) == 1 and isinstance(n.args[0], fx.Node):
                users = list(n.users)
                act = getattr(mod, "activation", None)
                out_node = n
                if act is None and len(users) == 1 and _activation_of(gm, users[0]) is not None:
                    act, out_node = _activation_of(gm, users[0]), users[0]
                src = n.args[0]
                in_q = carried.get(src.name) or qp(src)
                out_q = qp(out_node)
                qmin, qmax = _clamp(out_q, act)
                cls = StaticQuantConv2d if isinstance(mod, nn.Conv2d) else StaticQuantLinear
                qlayers[n.name] = cls(mod, in_q, out_q, qmin, qmax, act, backend)
                if out_node is not n:
                    absorbed[out_node.name] = n.name
                carried[out_node.name] = out_q
                steps.append(("qlayer", n, out_node.name))
                k = mod.in_channels if isinstance(mod, nn.Conv2d) else mod.in_features
                o = mod.out_channels if isinstance(mod, nn.Conv2d) else mod.out_features
                report.replaced.append((n.target, k, o))
                report.layer_bytes_before += _storage_bytes([p for p in (mod.weight, mod.bias) if p is not None])
                report.layer_bytes_after += _storage_bytes(list(qlayers[n.name].buffers()))
                continue
        ops = _add_operands(n)
        if ops is not None and all(o.name in carried for o in ops) and \
                carried[ops[0].name].dtype == carried[ops[1].name].dtype:
            users = list(n.users)
            act, out_node = None, n
            if len(users) == 1 and _activation_of(gm, users[0]) is not None:
                act, out_node = _activation_of(gm, users[0]), users[0]
                absorbed[out_node.name] = n.name
            out_q = qp(out_node)
            qlayers[n.name] = StaticQuantAdd(carried[ops[0].name], carried[ops[1].name], out_q,
                                             *_clamp(out_q, act), act, backend)
            carried[out_node.name] = out_q
            steps.append(("qadd", n, out_node.name))
            continue
        src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
        if src is not None and src.name in carried and _is_code_op(gm, n):
            carried[n.name] = carried[src.name]
            steps.append(("code", n, None))
        elif src is not None and src.name in carried and _activation_of(gm, n) == "relu":
            carried[n.name] = carried[src.name]
            steps.append(("relu_codes", n, None))
        else:
            steps.append(("float", n, None))

    # the float weights of the replaced layers are not needed any more
    replaced_targets = {t for t, _, _ in report.replaced}
    still_float = {n.target for n in gm.graph.nodes if n.op == "call_module" and n.name not in qlayers}
    for t in replaced_targets - still_float:
        parent, _, child = t.rpartition(".")
        setattr(gm.get_submodule(parent) if parent else gm, child, nn.Identity())
    out = StaticQuantModel(gm, qlayers, steps, r.name)
    report.bytes_after = model_bytes(out)
    if report.skipped:
        _log.warning("tessera.quantize recipe=%s: %d layers kept in float: %s", r.name, len(report.skipped),
                     "; ".join(f"{a}: {b}" for a, b in report.skipped))
    out.tessera_quant_report = report
    return out, report
