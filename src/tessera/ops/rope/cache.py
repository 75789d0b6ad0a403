"""``tessera.rope_cache``: the cos/sin tables ``tessera.rope`` reads, with the usual context-
extension rules.  Computed in float64, cast once to ``dtype``.

    inv_freq_i = base ** (-2i / rotary_dim),  i = 0 .. rotary_dim/2 - 1
    cos[p, i]  = m * cos(p * inv_freq_i),  sin[p, i] = m * sin(p * inv_freq_i)

with m = 1 except for YaRN (its attention factor).  ``scaling`` (sources: the rules as
documented by HF transformers' ``modeling_rope_utils`` and the papers; re-derived here):

* ``None``                                -- plain RoPE (Su et al., RoFormer).
* ``{"type": "linear", "factor": f}``     -- position interpolation: inv_freq / f
  (Chen et al. 2023).
* ``{"type": "ntk", "factor": f}``        -- NTK-aware base scaling (bloc97):
  base' = base * f ** (r / (r - 2)); the static form of HF's "dynamic" rule.
* ``{"type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
  "original_max_position_embeddings"}``   -- Llama 3.1: with wavelength w = 2 pi / inv_freq,
  L = orig / low_freq_factor, H = orig / high_freq_factor: w < H keeps inv_freq, w > L
  divides it by factor, in between t = (orig / w - low) / (high - low) blends
  (1 - t) * inv_freq / factor + t * inv_freq.
* ``{"type": "yarn", "factor", "original_max_position_embeddings", "beta_fast"=32,
  "beta_slow"=1, "attention_factor"=None}`` -- YaRN (Peng et al. 2023): correction range
  d(n) = r * ln(orig / (2 pi n)) / (2 ln base), low = max(floor(d(beta_fast)), 0),
  high = min(ceil(d(beta_slow)), r - 1); ramp_i = clamp((i - low) / (high - low), 0, 1);
  extrapolation weight e_i = 1 - ramp_i; inv_freq = inv_freq / f * (1 - e_i) + inv_freq * e_i;
  m = attention_factor or 0.1 ln(f) + 1 (1 when f <= 1).
"""
from __future__ import annotations

import math
import numbers

import torch

OP = "rope_cache"
_REQUIRED = {
    "linear": ("factor",),
    "ntk": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
_OPTIONAL = {"yarn": ("beta_fast", "beta_slow", "attention_factor")}


def _num(name, v, *, positive=True):
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(float(v)) \
            or (positive and float(v) <= 0):
        raise ValueError(f"tessera.{OP}: scaling[{name!r}]={v!r} must be a finite number"
                         + (" > 0" if positive else ""))
    return float(v)


def _check_scaling(scaling):
    if scaling is None:
        return None, {}
    if not isinstance(scaling, dict):
        raise TypeError(f"tessera.{OP}: argument 'scaling' must be a dict or None, got {type(scaling).__name__}")
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind not in _REQUIRED:
        raise ValueError(f"tessera.{OP}: argument 'scaling' has type={kind!r}; expected one of "
                         f"{tuple(_REQUIRED)} (or None for no scaling)")
    allowed = set(_REQUIRED[kind]) | set(_OPTIONAL.get(kind, ())) | {"type", "rope_type"}
    extra = sorted(set(scaling) - allowed)
    if extra:
        raise ValueError(f"tessera.{OP}: scaling type {kind!r} does not take {extra}; it takes "
                         f"{sorted(allowed - {'type', 'rope_type'})}")
    missing = [key for key in _REQUIRED[kind] if key not in scaling]
    if missing:
        raise ValueError(f"tessera.{OP}: scaling type {kind!r} needs {missing}")
    vals = {key: _num(key, scaling[key]) for key in _REQUIRED[kind]}
    for key in _OPTIONAL.get(kind, ()):
        if scaling.get(key) is not None:
            vals[key] = _num(key, scaling[key])
    if kind == "llama3" and vals["high_freq_factor"] <= vals["low_freq_factor"]:
        raise ValueError(f"tessera.{OP}: llama3 scaling needs high_freq_factor > low_freq_factor, got "
                         f"{vals['high_freq_factor']} <= {vals['low_freq_factor']}")
    return kind, vals


def inv_freq(rotary_dim: int, base: float = 10000.0, scaling=None) -> tuple[torch.Tensor, float]:
    """float64 inverse frequencies (rotary_dim/2,) and the cos/sin multiplier m."""
    kind, v = _check_scaling(scaling)
    r = rotary_dim
    i = torch.arange(0, r, 2, dtype=torch.float64)
    if kind == "ntk":
        base = base * v["factor"] ** (r / (r - 2)) if r > 2 else base * v["factor"]
    inv = base ** (-i / r)
    m = 1.0
    if kind == "linear":
        inv = inv / v["factor"]
    elif kind == "llama3":
        f, orig = v["factor"], v["original_max_position_embeddings"]
        lo, hi = v["low_freq_factor"], v["high_freq_factor"]
        wave = 2 * math.pi / inv
        t = ((orig / wave - lo) / (hi - lo)).clamp(0.0, 1.0)
        blended = (1 - t) * inv / f + t * inv
        inv = torch.where(wave < orig / hi, inv, torch.where(wave > orig / lo, inv / f, blended))
    elif kind == "yarn":
        f, orig = v["factor"], v["original_max_position_embeddings"]
        fast, slow = v.get("beta_fast", 32.0), v.get("beta_slow", 1.0)

        def dim_of(n_rot):
            return r * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(dim_of(fast)), 0), min(math.ceil(dim_of(slow)), r - 1)
        if low == high:
            high += 0.001  # avoid a zero-width ramp
        ramp = ((torch.arange(r // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
        extra = 1 - ramp
        inv = inv / f * (1 - extra) + inv * extra
        m = v.get("attention_factor", 0.1 * math.log(f) + 1.0 if f > 1 else 1.0)
    return inv, m


def rope_cache(max_positions: int, rotary_dim: int, base: float = 10000.0, scaling=None,
               dtype: torch.dtype = torch.float32, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables of shape (max_positions, rotary_dim // 2) for :func:`tessera.rope`."""
    for name, val in (("max_positions", max_positions), ("rotary_dim", rotary_dim)):
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise TypeError(f"tessera.{OP}: argument '{name}' must be an int, got {type(val).__name__}")
    if max_positions < 0:
        raise ValueError(f"tessera.{OP}: argument 'max_positions'={max_positions} must be >= 0")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"tessera.{OP}: argument 'rotary_dim'={rotary_dim} must be a positive even integer")
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"tessera.{OP}: argument 'base'={base!r} must be a finite number > 1")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"tessera.{OP}: argument 'dtype'={dtype} must be a floating dtype")
    inv, m = inv_freq(int(rotary_dim), float(base), scaling)
    ang = torch.arange(int(max_positions), dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang) * m, torch.sin(ang) * m
    return cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device)
