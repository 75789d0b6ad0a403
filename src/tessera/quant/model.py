"""The model API: quantisation recipes, weight quantisation for them, and ``quantize_model``.

Recipes (the ``recipe=`` strings of :func:`quantize_model` and ``tessera.nn.QuantLinear``):

================  ===================  ===================================================
recipe            op                   weight storage / activations
================  ===================  ===================================================
``w8a8``          ``linear_w8a8``      int8 [N, K], fp32 scale per output channel [N];
                                       x quantised to int8 per token inside the op
``a16w8``         ``linear_a16w8``     int8 per channel as w8a8; x int16 per token
``w4a16-g32``     ``linear_w4a16``     int4 symmetric, groups of 32 along K (packed uint8
``w4a16-g64``                          [N, K/2], fp32 scale [N, K/g]); float x
``w4a16-g128``
``w4a16-g128-zp`` ``linear_w4a16``     int4 with a uint8 zero point per group (GPTQ/AWQ)
``w4a8-g128``     ``linear_w4a8``      int4 symmetric g128; x int8 per token
``fp8-row``       ``linear_fp8``       float8_e4m3fn [N, K], fp32 scale per row [N];
                                       x e4m3 per token
``fp8-block``     ``linear_fp8``       float8_e4m3fn, fp32 scale per 128x128 block
                                       (DeepSeek-V3); x e4m3 per (token, 128 of K)
================  ===================  ===================================================

Static (calibrated) recipes for CNNs -- ``int8-static`` and ``a16w8-static``: every nn.Conv2d /
nn.Linear computed by ``conv2d_int8`` / ``linear_int8_requant`` with calibrated activation ranges
(``tessera.quantize(model, "int8-static", calibration=[batch, ...])`` returns a new
``StaticQuantModel``) -- are in ``tessera.quant.static`` (``STATIC_RECIPES``; not in ``RECIPES``,
the per-layer weight recipes above).

Weights are quantised with ``tessera.quant.contract`` (round-to-nearest, absmax scales: no
calibration data, no GPTQ error feedback).  int4 recipes need ``in_features % group == 0``;
:func:`quantize_model` leaves (and reports) the layers that do not fit.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Iterable, Optional

import torch

from . import contract
from .contract import pack_int4


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    op: str                    # tessera op computing the layer
    kind: str                  # "int8", "int4", "fp8-row", "fp8-block"
    group: int = 0             # int4 group size along K
    zero_point: bool = False   # int4 with a zero point per group
    doc: str = ""


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("w8a8", "linear_w8a8", "int8", doc="int8 per-channel weights, int8 per-token activations"),
    Recipe("a16w8", "linear_a16w8", "int8", doc="int8 per-channel weights, int16 per-token activations"),
    Recipe("w4a16-g32", "linear_w4a16", "int4", 32, doc="int4 symmetric, group 32, float activations"),
    Recipe("w4a16-g64", "linear_w4a16", "int4", 64, doc="int4 symmetric, group 64, float activations"),
    Recipe("w4a16-g128", "linear_w4a16", "int4", 128, doc="int4 symmetric, group 128, float activations"),
    Recipe("w4a16-g128-zp", "linear_w4a16", "int4", 128, True, doc="int4 + zero point, group 128"),
    Recipe("w4a8-g128", "linear_w4a8", "int4", 128, doc="int4 symmetric g128, int8 per-token activations"),
    Recipe("fp8-row", "linear_fp8", "fp8-row", doc="e4m3 per-row weights, e4m3 per-token activations"),
    Recipe("fp8-block", "linear_fp8", "fp8-block", doc="e4m3 128x128-block weights, e4m3 1x128 activations"),
)}


def get_recipe(recipe, where: str = "tessera.quant") -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if not isinstance(recipe, str):
        raise TypeError(f"{where}: argument 'recipe' must be a str, got {type(recipe).__name__}")
    if recipe not in RECIPES:
        raise ValueError(f"{where}: argument 'recipe'={recipe!r} is not a recipe; expected one of {tuple(RECIPES)}")
    return RECIPES[recipe]


def fits(recipe: Recipe, in_features: int) -> tuple[bool, str]:
    """Can a layer with this many input features use the recipe? -> (ok, reason)."""
    if recipe.kind == "int4" and in_features % recipe.group:
        return False, f"in_features={in_features} is not a multiple of the recipe's group {recipe.group}"
    return True, ""


def buffer_specs(recipe: Recipe, out_features: int, in_features: int) -> dict[str, tuple[tuple, torch.dtype]]:
    """Name -> (shape, dtype) of the quantised weight buffers of a layer."""
    N, K = out_features, in_features
    if recipe.kind == "int8":
        return {"weight": ((N, K), torch.int8), "weight_scale": ((N,), torch.float32)}
    if recipe.kind == "int4":
        out = {"weight": ((N, K // 2), torch.uint8), "weight_scale": ((N, K // recipe.group), torch.float32)}
        if recipe.zero_point:
            out["weight_zero"] = ((N, K // recipe.group), torch.uint8)
        return out
    if recipe.kind == "fp8-row":
        return {"weight": ((N, K), torch.float8_e4m3fn), "weight_scale": ((N,), torch.float32)}
    return {"weight": ((N, K), torch.float8_e4m3fn), "weight_scale": ((-(-N // 128), -(-K // 128)), torch.float32)}


def quantize_weight(weight: torch.Tensor, recipe) -> dict[str, torch.Tensor]:
    """A float [N, K] weight -> the recipe's buffers (``weight``, ``weight_scale``[, ``weight_zero``])."""
    r = get_recipe(recipe)
    w = weight.detach().float()
    ok, why = fits(r, w.shape[1])
    if not ok:
        raise ValueError(f"tessera.quant: recipe {r.name!r} cannot quantise a weight of shape {tuple(w.shape)}: {why}")
    if r.kind == "int8":
        q, s = contract.quantize_rows(w, torch.int8)
        return {"weight": q, "weight_scale": s}
    if r.kind == "int4":
        q, s, z = contract.quantize_groups(w, r.group, "int4", zero_point=r.zero_point)
        out = {"weight": pack_int4(q), "weight_scale": s}
        if r.zero_point:
            out["weight_zero"] = z
        return out
    if r.kind == "fp8-row":
        q, s = contract.quantize_rows(w, torch.float8_e4m3fn)
        return {"weight": q, "weight_scale": s}
    q, s = contract.quantize_blocks(w, 128, torch.float8_e4m3fn)
    return {"weight": q, "weight_scale": s}


def dequantize_weight(buffers: dict, recipe) -> torch.Tensor:
    """The recipe's buffers -> the fp32 [N, K] weight they represent: the ops' own dequantisers
    (one definition per weight layout: per-row / per-128x128-block scales, int4 groups)."""
    from ..ops._qlinear_int4 import dequantize_weight as int4_weight
    from ..ops.linear_fp8.ref import dequantize_weight as scaled_weight

    r = get_recipe(recipe)
    q, s = buffers["weight"], buffers["weight_scale"]
    if r.kind == "int4":
        return int4_weight(q, s, buffers.get("weight_zero"), r.group, torch.float32)
    return scaled_weight(q, s, torch.float32)  # int8 / fp8 rows, fp8 blocks: q * s in fp32


# ---------------------------------------------------------------- quantize_model

def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.device) if t.numel() else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (tied tensors counted once)."""
    return _storage_bytes(list(model.parameters()) + list(model.buffers()))


@dataclasses.dataclass
class QuantReport:
    """What :func:`quantize_model` did: replaced and skipped layers, and the model's size."""
    recipe: str
    replaced: list = dataclasses.field(default_factory=list)   # (name, in_features, out_features)
    skipped: list = dataclasses.field(default_factory=list)    # (name, reason)
    bytes_before: int = 0          # whole model: parameters + buffers
    bytes_after: int = 0
    layer_bytes_before: int = 0    # the replaced nn.Linear layers only (weight + bias)
    layer_bytes_after: int = 0     # their QuantLinear buffers
    model: Optional[torch.nn.Module] = dataclasses.field(default=None, repr=False)  # static recipes: the new model

    @property
    def ratio(self) -> float:
        """Model size reduction: bytes_before / bytes_after."""
        return self.bytes_before / self.bytes_after if self.bytes_after else float("inf")

    @property
    def layer_ratio(self) -> float:
        return self.layer_bytes_before / self.layer_bytes_after if self.layer_bytes_after else float("inf")

    def __str__(self) -> str:
        mib = 1 << 20
        kind = "conv/linear" if self.model is not None else "linear"
        lines = [f"tessera.quantize recipe={self.recipe}: {len(self.replaced)} {kind} layers replaced, "
                 f"{len(self.skipped)} skipped",
                 f"  model  : {self.bytes_before / mib:9.3f} MiB -> {self.bytes_after / mib:9.3f} MiB "
                 f"({self.ratio:.2f}x smaller)",
                 f"  layers : {self.layer_bytes_before / mib:9.3f} MiB -> {self.layer_bytes_after / mib:9.3f} MiB "
                 f"({self.layer_ratio:.2f}x smaller)"]
        for name, k, n in self.replaced:
            lines.append(f"  replaced {name:<40s} {k:>6d} -> {n:<6d}")
        for name, why in self.skipped:
            lines.append(f"  skipped  {name:<40s} {why}")
        return "\n".join(lines)


def _matches(name: str, patterns) -> bool:
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize_model(model: torch.nn.Module, recipe: str, *, skip=(), backend: Optional[str] = None,
                   calibration=None) -> QuantReport:
    """Replace every ``torch.nn.Linear`` of ``model`` in place by a ``tessera.nn.QuantLinear``
    of ``recipe`` (see the module docstring), except:

    * layers whose qualified name matches an entry of ``skip`` (exact names or fnmatch
      patterns, e.g. ``("lm_head", "*.gate")``);
    * layers whose ``in_features`` does not fit the recipe (int4 group size);
    * the output projection inside ``torch.nn.MultiheadAttention`` (it reads ``.weight``
      directly instead of calling the layer).

    Skipped layers stay float and are listed in the returned :class:`QuantReport` with the
    reason; the report is also kept as ``model.tessera_quant_report`` (``tessera.quantize``
    returns the model, not the report).  ``backend`` is stored on the new layers and passed to
    every op call.

    Static recipes (``int8-static``, ``a16w8-static``: ``tessera.quant.static``) need
    ``calibration`` (an iterable of input batches), quantize every Conv2d and Linear, leave
    ``model`` untouched and return the report with the new model as ``report.model``
    (``tessera.quantize`` returns that model)."""
    from ..nn.quant_linear import QuantLinear
    from .static import STATIC_RECIPES, quantize_static

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tessera.quantize_model: argument 'model' must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(recipe, str) and recipe in STATIC_RECIPES:
        if skip:
            raise ValueError(f"tessera.quantize_model: argument 'skip' is not supported by the static recipe {recipe!r}")
        report = QuantReport(recipe, bytes_before=model_bytes(model))
        report.model = quantize_static(model, recipe, calibration, backend=backend, report=report)[0]
        return report
    if isinstance(recipe, str) and recipe not in RECIPES:
        raise ValueError(f"tessera.quantize_model: argument 'recipe'={recipe!r} is not a recipe; expected one of "
                         f"{tuple(RECIPES) + tuple(STATIC_RECIPES)}")
    if calibration is not None:
        raise ValueError(f"tessera.quantize_model: argument 'calibration' is only used by the static recipes "
                         f"{tuple(STATIC_RECIPES)}; recipe {recipe!r} quantizes weights without calibration data")
    r = get_recipe(recipe, "tessera.quantize_model")
    if isinstance(skip, str):
        skip = (skip,)
    report = QuantReport(r.name, bytes_before=model_bytes(model))
    parents = {name: mod for name, mod in model.named_modules()}
    targets = []
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or isinstance(mod, QuantLinear):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = parents[parent_name] if parent_name else model
        if _matches(name, skip):
            report.skipped.append((name, "matches skip"))
        elif isinstance(parent, torch.nn.MultiheadAttention):
            report.skipped.append((name, "MultiheadAttention reads its weight directly"))
        elif not fits(r, mod.in_features)[0]:
            report.skipped.append((name, fits(r, mod.in_features)[1]))
        else:
            targets.append((name, parent, child, mod))
    for name, parent, child, mod in targets:
        q = QuantLinear.from_linear(mod, r.name, backend=backend)
        setattr(parent, child, q)
        report.replaced.append((name, mod.in_features, mod.out_features))
        report.layer_bytes_before += _storage_bytes([p for p in (mod.weight, mod.bias) if p is not None])
        report.layer_bytes_after += _storage_bytes(list(q.buffers()))
    report.bytes_after = model_bytes(model)
    model.tessera_quant_report = report  # a plain attribute: not in state_dict()
    return report
