"""max_pool2d_int8 native CPU kernel module (max_pool2d_int8.c)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...backends import cpu
from . import output

DTYPES = (torch.int8, torch.int16)
_SRC = Path(__file__).with_name("max_pool2d_int8.c")


def forward(x, k, s, p, d, ceil_mode, Ho, Wo, channels_last):
    """x [N, C, H, W] (any strides) -> y [N, C, Ho, Wo] in x's format."""
    y = output(x, Ho, Wo, channels_last)
    if y.numel():
        f = cpu.declare(cpu.library("max_pool2d_int8", _SRC), "tsr_max_pool2d_int8", "pi" + "l" * 8 + "i" * 8 + "ll"
                        + "p" + "l" * 4 + "i")
        rc = f(cpu.ptr(x), x.element_size(), *x.shape, *x.stride(), *k, *s, *p, *d, Ho, Wo, cpu.ptr(y), *y.stride(),
               cpu.threads_for(y.numel() * k[0] * k[1]))
        cpu.check_rc(rc, "max_pool2d_int8")
    return y


def backward(*args):
    raise NotImplementedError("max_pool2d_int8 has no gradient (integer op)")
