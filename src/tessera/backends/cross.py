"""Edge-CPU backends ``cpu:aarch64`` and ``cpu:riscv64``: the native C kernels, cross-compiled,
run in a remote runner process (qemu-user here, a board over TCP).

Python cannot load an aarch64 or riscv64 library in-process, so the kernels of the ops this
backend serves are linked, with ``csrc/runner/tsr_runner.c`` and a generated kernel table, into
one static program per target.  One runner process per (target, vector length) serves every
call of a Python process: start-up once, then each call ships its input buffers over a pipe
(or a TCP socket) and reads the outputs back (the protocol is in tsr_runner.c).

* ``cpu:aarch64`` -- ``aarch64-linux-gnu-gcc -march=armv8-a`` (NEON, the Armv8.0 baseline),
  run as ``qemu-aarch64-static -cpu max``.
* ``cpu:riscv64`` -- ``clang-19 --target=riscv64-linux-gnu -march=rv64gcv`` (RVV 1.0; gcc 12
  cannot compile RVV), run as ``qemu-riscv64-static -cpu rv64,v=true,vlen=N,elen=64,
  vext_spec=v1.0`` with N = ``TESSERA_RVV_VLEN`` (default 256; one binary, correct at 128-512).

``TESSERA_REMOTE=host:port`` sends the calls to a runner already listening on a board
(``tsr_runner --listen PORT``: the cached binary ``<jit cache>/cross/tsr_runner-<arch>-<hash>``)
instead of starting qemu; the runner's hello must name the requested architecture.

Threads: the runner is single-threaded (a static binary without OpenMP; clang has no riscv64
libomp here), so the kernels get ``nthreads = 1`` and ordinary (not non-temporal) stores.

Builds (backends/cross_lib.py) are cached like the C JIT: ``<jit cache>/cross/<target>-<hash>``,
the hash covering every source and header, the generated table, the flags and the compiler's
version line, built under an exclusive file lock and landed by an atomic rename.  A missing toolchain or qemu makes the
backend unavailable with the reason (``tessera info``), never an import error or a crash.

A runner that dies (killed, crashed) during a call raises :class:`RunnerError` naming the call
and the exit status; that runner is dropped and the next call starts a new one.
"""
from __future__ import annotations

import contextvars
import ctypes
import dataclasses
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import torch


ROOT = Path(__file__).resolve().parent.parent
RUNNER_SRC = ROOT / "csrc" / "runner"

# kernel entry point -> (source file under ops/, argument kinds: l int64, i int32, f float,
# r input pointer, w output pointer, u in-out pointer).  A new op adds its lines here and an
# ``ops/<op>/cross.py`` launcher; the runner is rebuilt automatically (the table is hashed).
KERNELS = {
    "tsr_rms_norm_fwd": ("rms_norm/rms_norm.c", "rlrlrwwwllfiii"),
    "tsr_rms_norm_bwd": ("rms_norm/rms_norm.c", "rlrlrlrrwwlliii"),
    "tsr_layer_norm_fwd": ("layer_norm/layer_norm.c", "rlrlrrwwwwllfiii"),
    "tsr_layer_norm_bwd": ("layer_norm/layer_norm.c", "rlrlrlrrrwwwlliii"),
    "tsr_softmax_fwd": ("softmax/softmax.c", "rlwlliili"),
    "tsr_softmax_bwd": ("softmax/softmax.c", "rlrlwlliili"),
    "tsr_act_fwd": ("_elementwise/activations.c", "rlwlliiii"),
    "tsr_act_bwd": ("_elementwise/activations.c", "rlrlwlliiii"),
    "tsr_glu_fwd": ("_elementwise/activations.c", "rlrlwlliiii"),
    "tsr_glu_bwd": ("_elementwise/activations.c", "rlrlrlwwlliiii"),
    "tsr_quantize_blocks": ("quantize/quantize.c", "rlllii" + "llll" + "wwwi"),
    "tsr_dequantize_blocks": ("dequantize/dequantize.c", "rlllirrlllwiii"),
    "tsr_rope": ("rope/rope.c", "rrrrrwwr" + "iiiiiii"),
    "tsr_qi8_mm": ("_qlinear_int8/qlinear_int8.c", "rliillrlrriwiii"),
    "tsr_linear_fp8": ("linear_fp8/linear_fp8.c", "rlrrrw" + "lll" + "iiiiii"),
    "tsr_qlinear_int4": ("_qlinear_int4/qlinear_int4.c", "irlirrrrw" + "llll" + "iii"),
    "tsr_attn_fwd": ("attention/attention_fwd.c", "rllrllrll" + "rr" + "llll" + "fllf" + "ww" + "ili"),
    "tsr_attn_bwd": ("attention/attention_bwd.c", "rll" * 5 + "rrr" + "llll" + "fllf" + "www" + "iii"),
    "tsr_append_kv": ("append_kv/append_kv.c", "ruurr" + "lllllll" + "iii"),
    "tsr_decode_attention": ("decode_attention/decode_attention.c", "rrrrrrrw" + "lllllll" + "ff" + "l" + "iii" + "l"),
    # the runner's own: dtype conversions through the per-ISA row helpers (tests/test_cross.py)
    "tsr_runner_convert": (None, "rwlii"),
}


@dataclasses.dataclass(frozen=True)
class Target:
    arch: str
    cc: tuple[str, ...]          # compiler command (first item looked up on PATH)
    flags: tuple[str, ...]
    qemu: str
    objdump: str                 # disassembler that knows the target's vector instructions

    def qemu_args(self) -> list[str]:
        if self.arch == "riscv64":
            return ["-cpu", f"rv64,v=true,vlen={rvv_vlen()},elen=64,vext_spec=v1.0"]
        return ["-cpu", "max"]


TARGETS = {
    "cpu:aarch64": Target("aarch64", ("aarch64-linux-gnu-gcc",), ("-march=armv8-a",),
                          "qemu-aarch64-static", "aarch64-linux-gnu-objdump"),
    "cpu:riscv64": Target("riscv64", ("clang-19", "--target=riscv64-linux-gnu"),
                          ("-march=rv64gcv", "-mabi=lp64d"), "qemu-riscv64-static", "llvm-objdump-19"),
}
VLENS = (128, 256, 512)


def rvv_vlen() -> int:
    v = os.environ.get("TESSERA_RVV_VLEN", "256")
    if not v.isdigit() or int(v) not in VLENS:
        raise ValueError(f"TESSERA_RVV_VLEN={v!r}: expected one of {VLENS}")
    return int(v)


class RunnerError(RuntimeError):
    """The remote runner failed: could not start, died mid-call, or broke the protocol."""


# ----------------------------------------------------------------------------- availability

def missing_tools(name: str) -> list[str]:
    """The tools ``name`` needs that are not on PATH (qemu is not needed with TESSERA_REMOTE)."""
    t = TARGETS[name]
    need = [t.cc[0]] + ([] if os.environ.get("TESSERA_REMOTE") else [t.qemu])
    return [tool for tool in need if shutil.which(tool) is None]


def available(name: str, device: torch.device) -> tuple[bool, str]:
    if device.type != "cpu":
        return False, f"the {name} backend runs on CPU tensors (shipped to its runner), got device {device}"
    miss = missing_tools(name)
    if miss:
        return False, (f"{name}: missing {', '.join(miss)} (Debian: apt-get install qemu-user-static "
                       f"gcc-aarch64-linux-gnu clang-19 gcc-riscv64-linux-gnu libc6-dev-riscv64-cross)")
    return True, ""


def describe() -> dict:
    out = {}
    for name, t in TARGETS.items():
        ok, why = available(name, torch.device("cpu"))
        d = {"available": ok, "reason": why, "compiler": " ".join(t.cc), "emulator": t.qemu,
             "remote": os.environ.get("TESSERA_REMOTE", "")}
        if t.arch == "riscv64":
            d["rvv_vlen"] = os.environ.get("TESSERA_RVV_VLEN", "256")
        out[name] = d
    return out


# ----------------------------------------------------------------------------- build

def runner_path(name: str, portable: bool = False) -> Path:
    """The cached runner binary for ``name``, built first if needed (backends/cross_lib.py)."""
    from .cross_lib import runner_path as _runner_path
    return _runner_path(name, portable)


# sources linked beside a kernel file: shared helpers without an entry point of their own
COMPANIONS = {"attention/attention_fwd.c": ("attention/attn_tiles.c",),
              "attention/attention_bwd.c": ("attention/attn_tiles.c",)}


def kernel_sources() -> list[Path]:
    srcs = {src for src, _ in KERNELS.values() if src}
    srcs |= {c for s in list(srcs) for c in COMPANIONS.get(s, ())}
    return sorted(ROOT / "ops" / s for s in srcs)


# ----------------------------------------------------------------------------- runner process

class Runner:
    """One runner: a qemu child over pipes, or a TCP connection to a board."""

    def __init__(self, name: str, portable: bool = False, qemu_extra: tuple[str, ...] = ()):
        self.name = name
        self.proc = None
        self.sock = None
        remote = None if qemu_extra else os.environ.get("TESSERA_REMOTE")
        if remote:
            host, _, port = remote.rpartition(":")
            try:
                self.sock = socket.create_connection((host or "localhost", int(port)), timeout=60)
            except (OSError, ValueError) as e:
                raise RunnerError(f"{name}: cannot connect to TESSERA_REMOTE={remote!r}: {e}") from None
            self.sock.settimeout(None)
            self._r, self._w = self.sock.makefile("rb"), self.sock.makefile("wb")
        else:
            t = TARGETS[name]
            cmd = [t.qemu, *t.qemu_args(), *qemu_extra, str(runner_path(name, portable))]
            self.errf = tempfile.TemporaryFile()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errf)
            self._r, self._w = self.proc.stdout, self.proc.stdin
        self._w.write(struct.pack("<I", 1))
        self._w.flush()
        self.info = dict(kv.split("=", 1) for kv in self._read(struct.unpack("<H", self._read(2, "hello"))[0],
                                                               "hello").decode().split())
        if self.info.get("arch") != TARGETS[name].arch:
            raise RunnerError(f"{name}: the runner at {remote or cmd} is a {self.info.get('arch')} runner")

    def _read(self, n: int, what: str) -> bytes:
        chunks, got = [], 0
        while got < n:
            b = self._r.read(n - got)
            if not b:
                raise RunnerError(self._death(what))
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)

    def _death(self, what: str) -> str:
        if self.proc is None:
            return f"{self.name}: the remote runner at {os.environ.get('TESSERA_REMOTE')} closed the connection during {what}"
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.errf.seek(0)
        err = self.errf.read()[-2000:].decode(errors="replace").strip()
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return (f"{self.name}: the runner (pid {self.proc.pid}) died during {what} ({how})"
                + (f": {err}" if err else "") + "; the next call starts a new runner")

    def call(self, fn: str, kinds: str, args) -> int:
        msg = [struct.pack("<IH", 2, len(fn)), fn.encode(), struct.pack("<H", len(kinds))]
        outs = []
        for k, a in zip(kinds, args):
            if k in "rwu":
                if a is None:
                    msg.append(b"n")
                    continue
                n = _span_bytes(a)
                if k == "w":
                    msg.append(b"w" + struct.pack("<Q", n))
                else:
                    msg.append(k.encode() + struct.pack("<Q", n) + ctypes.string_at(a.data_ptr(), n))
                if k != "r":
                    if not a.is_contiguous():
                        raise ValueError(f"{fn}: output buffers must be contiguous")
                    outs.append((a, n))
            elif k == "l":
                msg.append(b"l" + struct.pack("<q", int(a)))
            elif k == "i":
                msg.append(b"i" + struct.pack("<i", int(a)))
            else:
                msg.append(b"f" + struct.pack("<f", float(a)))
        try:
            self._w.write(b"".join(msg))
            self._w.flush()
        except OSError:
            raise RunnerError(self._death(fn)) from None
        status, rc, n = struct.unpack("<iiH", self._read(10, fn))
        text = self._read(n, fn).decode(errors="replace")
        if status != 0:
            raise RunnerError(f"{self.name}: runner refused {fn}: {text} (status {status})")
        for t, nbytes in outs:
            data = self._read(nbytes, fn)
            ctypes.memmove(t.data_ptr(), data, nbytes)
        return rc

    def close(self) -> None:
        try:
            self._w.write(struct.pack("<I", 3))
            self._w.flush()
        except (OSError, ValueError):
            pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.sock is not None:
            self.sock.close()


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to the end of its last (what a kernel may touch)."""
    if t.device.type != "cpu":
        raise ValueError(f"remote backends take CPU tensors, got {t.device}")
    if t.numel() == 0:
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))) * t.element_size()


_runners: dict[tuple, Runner] = {}
_runner_lock = threading.Lock()
_target: contextvars.ContextVar[str] = contextvars.ContextVar("tessera_cross_target", default="")


def _key(name: str) -> tuple:
    remote = os.environ.get("TESSERA_REMOTE", "")
    return (name, remote, rvv_vlen() if TARGETS[name].arch == "riscv64" and not remote else 0)


def runner(name: str) -> Runner:
    key = _key(name)
    r = _runners.get(key)
    if r is not None and r.proc is not None and r.proc.poll() is not None:
        r = None   # died between calls: start a fresh one
    if r is None:
        r = _runners[key] = Runner(name)
    return r


def shutdown() -> None:
    """Stop every runner this process started (tests; the OS reaps them at exit otherwise)."""
    with _runner_lock:
        for r in _runners.values():
            r.close()
        _runners.clear()


def call(fn: str, *args) -> int:
    """Run kernel ``fn`` on the current call's target (set by the bound kernel module); tensors
    for pointer arguments, numbers for scalars.  Returns the kernel's return code."""
    name = _target.get()
    if not name:
        raise RuntimeError("cross.call outside a cpu:<arch> backend call")
    kinds = KERNELS[fn][1]
    if len(args) != len(kinds):
        raise TypeError(f"{fn} takes {len(kinds)} arguments, got {len(args)}")
    with _runner_lock:
        r = runner(name)
        try:
            return r.call(fn, kinds, args)
        except RunnerError:
            if r.proc is None or r.proc.poll() is not None:
                _runners.pop(_key(name), None)   # dead: the next call starts a new runner
            raise


def check_rc(rc: int, what: str) -> None:
    if rc == -1:
        raise MemoryError(f"tessera {_target.get()} backend: {what}: out of memory for scratch buffers")
    if rc != 0:
        raise RuntimeError(f"tessera {_target.get()} backend: {what}: kernel returned error {rc}")


# ----------------------------------------------------------------------------- kernel modules

class _Bound:
    """A kernel module seen through one target: ``forward``/``backward`` run with that target
    current; every other attribute (DTYPES, BACKWARD, ...) is the module's own, read live, so a
    test that patches the module patches every target."""

    def __init__(self, mod, name: str):
        self._mod, self._name = mod, name
        self.__name__ = mod.__name__   # the path in spec.kernels, as for every other backend

    def _run(self, which: str, args, kwargs):
        token = _target.set(self._name)
        try:
            return getattr(self._mod, which)(*args, **kwargs)
        finally:
            _target.reset(token)

    def forward(self, *args, **kwargs):
        return self._run("forward", args, kwargs)

    def backward(self, *args, **kwargs):
        return self._run("backward", args, kwargs)

    def __getattr__(self, attr):
        return getattr(self._mod, attr)


_bound: dict[tuple[str, str], _Bound] = {}


def bind(mod, name: str) -> _Bound:
    """The kernel module ``mod`` (an ``ops/<op>/cross.py``) bound to target ``name``: its launchers
    run with that target current, so one launcher file serves every edge-CPU backend."""
    key = (mod.__name__, name)
    b = _bound.get(key)
    if b is None:
        b = _bound[key] = _Bound(mod, name)
    return b
