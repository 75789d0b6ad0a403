"""Bookkeeping for ``tessera.patch``: what was swapped on a model, and how to put it back.

Every change ``tessera.patch`` makes is recorded as an undo step on the model itself
(``model._tessera_undo``, a list of plain tuples run in reverse by ``tessera.unpatch``; data,
not closures, so ``copy.deepcopy`` of a patched model copies steps that point at the copy's
own modules), so a model can be patched and restored any number of times and two models of
one family are independent:

* per-instance ``forward`` overrides (norms, MLPs, attention modules, the causal-LM head) --
  undone by deleting the instance attribute, or restoring one that was there before;
* ``config._attn_implementation`` -- restored to the previous value;
* module-level functions of a ``transformers`` modeling file (``apply_rotary_pos_emb``) --
  these are shared by every model of the family, so the swap is reference-counted per
  file: the dispatcher goes in with the first patched model and comes out with the last,
  and it only takes the tessera path inside a patched attention module (a context flag
  set by that module's forward), so an unpatched model of the same family is untouched.
"""
from __future__ import annotations

import contextvars
import sys
import types
from typing import Callable

ATTR = "_tessera_undo"

# set while a patched attention module's forward runs; read by the module-level dispatchers
ROPE_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("tessera_rope_active", default=False)

_GLOBAL_SWAPS: dict[tuple[str, str], list] = {}   # (module, name) -> [original, refcount]


def steps(model) -> list:
    undo = model.__dict__.get(ATTR)
    if undo is None:
        undo = []
        object.__setattr__(model, ATTR, undo)  # plain attribute: not a submodule, not in state_dict
    return undo


def is_patched(model) -> bool:
    return bool(model.__dict__.get(ATTR))


def override_forward(model, module, fn: Callable) -> None:
    """Give ``module`` an instance-level ``forward`` (``fn(module, *args, **kwargs)``)."""
    had = "forward" in module.__dict__
    steps(model).append(("forward", module, had, module.__dict__.get("forward")))
    module.forward = types.MethodType(fn, module)


def set_attr(model, obj, name: str, value) -> None:
    steps(model).append(("attr", obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def ensure_global(module_name: str, name: str, make_dispatcher: Callable[[Callable], Callable]) -> None:
    """Install ``make_dispatcher(original)`` as ``module_name.name`` unless it is there already."""
    if (module_name, name) not in _GLOBAL_SWAPS:
        mod = sys.modules[module_name]
        original = getattr(mod, name)
        setattr(mod, name, make_dispatcher(original))
        _GLOBAL_SWAPS[(module_name, name)] = [original, 0]


def swap_global(model, module_name: str, name: str, make_dispatcher: Callable[[Callable], Callable]) -> None:
    """Replace ``module_name.name`` by ``make_dispatcher(original)`` while any patched model needs it
    (reference-counted; a patched module also re-installs it on each call, see attention.py, so a
    deep copy of a patched model -- whose count was never taken -- still runs patched)."""
    ensure_global(module_name, name, make_dispatcher)
    _GLOBAL_SWAPS[(module_name, name)][1] += 1
    steps(model).append(("global", module_name, name))


def _undo_step(step) -> None:
    kind = step[0]
    if kind == "forward":
        _, module, had, previous = step
        if had:
            module.forward = previous
        else:
            module.__dict__.pop("forward", None)
    elif kind == "attr":
        _, obj, name, previous = step
        setattr(obj, name, previous)
    else:
        _, module_name, name = step
        entry = _GLOBAL_SWAPS.get((module_name, name))
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                setattr(sys.modules[module_name], name, entry[0])
                del _GLOBAL_SWAPS[(module_name, name)]


def run_undo(model) -> None:
    undo = model.__dict__.get(ATTR) or []
    while undo:
        _undo_step(undo.pop())
