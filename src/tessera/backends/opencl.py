"""OpenCL backend: edge GPUs / DSPs (Mali, Adreno, PowerVR, vendors' own), verified on PoCL.

Runtime surface, tinygrad-sized: pick a device, build (and cache) a program, wrap a tensor's
memory as a buffer, launch.  Kernels are OpenCL C 1.2 files beside each op (``ops/<op>/*.cl``)
that include only ``csrc/opencl/tessera_cl.h``; launchers (``ops/<op>/opencl.py``) touch torch.

Memory model: zero-copy host memory.  Edge GPUs share DRAM with the CPU, so the backend runs
on CPU torch tensors and hands the kernels buffers created *over their memory*
(``CL_MEM_USE_HOST_PTR``), never copies in and out.  A buffer covers exactly the bytes a
tensor view spans (first to last element), so a runtime that chose to copy (the spec allows
it for USE_HOST_PTR) could not read or write outside the view.  After a kernel, each written
buffer is mapped and unmapped: with a zero-copy runtime (PoCL, and drivers that honour
USE_HOST_PTR on unified memory: Mali, Adreno) that is a no-op; with a copying runtime it is
the write-back the spec requires before the host may read ``host_ptr``.  So results are
correct either way and the cost of a copying device shows up in the benchmark, not as a bug.
Row views follow the cpu backend's rules: unit inner stride, any row stride (0 = broadcast).

Device choice: ``TESSERA_OPENCL_DEVICE`` = ``"P:D"`` (platform and device index), ``"N"``
(index in the flat list ``tessera info`` prints) or a case-insensitive substring of
"platform / device" names.  Default: the first GPU, else the first other device that is not
the Oclgrind simulator (Oclgrind checks races and out-of-bounds accesses; it is chosen only by
name, by the marked test that runs every kernel under it).

Extensions (``FEATURES``; each a build option, so the cached binaries differ), used where the
device lists them, a portable path otherwise:
  ``cl_khr_fp16``  fp16 arithmetic (``TSR_HAS_FP16``); otherwise fp16 is storage only
      (``vload_half``/``vstore_half_rte`` or bit-exact integer conversion: PoCL).  bf16 is always
      storage (ushort) with round-to-nearest-even by integer arithmetic.
  ``cl_khr_subgroups`` / ``cl_intel_subgroups``  the work-group reductions of the row kernels
      (``tsr_wg_sum`` / ``tsr_wg_max`` / ``tsr_wg_min_int`` in ``tessera_cl.h``: rms_norm,
      layer_norm, softmax, quantize_blocks, the int8 / fp8 linears' activation quantisers) reduce
      within each sub-group with ``sub_group_reduce_*`` and combine the partials through local
      memory (``TSR_HAS_SUBGROUPS``); portable: a fixed tree through local memory.
  ``cl_khr_integer_dot_product``  the int8 matmuls (int_mm, linear_w8a8: both kernel families)
      and linear_w4a8 take 4 k per non-saturating ``dot(char4, char4)`` / ``dot(char4, uchar4)``
      (``TSR_HAS_INT_DOT``); portable: scalar products.  Same integers either way.
The khr sub-group and dot built-ins are declared only for OpenCL C >= 2.0, so a build using
them asks for the device's own OpenCL C version (``_cl_std``; otherwise ``-cl-std=CL1.2``), and
a compiler that still declares none falls back to the portable path (``tessera_cl.h``).
``TESSERA_OPENCL_PORTABLE=1`` forces the portable path everywhere (tests run both).
``TESSERA_OPENCL_EMULATE=subgroups,int_dot`` (tests only) builds with ``tessera_cl_emulate.h``,
which supplies those built-ins in OpenCL C 1.2 (sub-groups of 4 work-items through local memory,
``dot`` as the widened sum), so the extension paths run -- and are checked against the other
backends and under Oclgrind -- on a device without the extensions (PoCL); on a CPU device the
row kernels then take the GPU geometry (several sub-groups per row).  ``paths()`` says which path
each feature takes; `tessera info` prints it for the selected device.

Programs are built once per (source, options, device) and their binaries cached on disk
under ``<jit cache>/opencl``, keyed by a hash of the sources and headers, the build options
and the device/driver strings, written under a file lock with an atomic rename, as the C JIT
does (a PoCL build takes ~1 s cold).  Each file carries a sha256 of the binary, checked before the
driver sees it: a damaged file is rebuilt (PoCL segfaults on a truncated binary).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

import torch

from .. import _env, _jit

CL_SRC = Path(__file__).resolve().parent.parent / "csrc" / "opencl"
# dtype codes shared with csrc/opencl/tessera_cl.h (the same as the cpu backend's)
DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    return importlib.util.find_spec("pyopencl") is not None


def _cl():
    import pyopencl as cl  # only on first use: `import tessera` initialises no device
    return cl


@functools.lru_cache(maxsize=None)
def devices() -> list[tuple[str, object, object]]:
    """Every OpenCL device on this machine: [(label, platform, device)], in a stable order."""
    if not _importable():
        return []
    cl = _cl()
    try:
        plats = cl.get_platforms()
    except cl.Error:  # an ICD loader with no platform raises instead of returning []
        return []
    out = []
    for pi, p in enumerate(plats):
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for di, d in enumerate(devs):
            out.append((f"{pi}:{di} {p.name.strip()} / {d.name.strip()}", p, d))
    return out


def _pick(spec: str):
    devs = devices()
    if not devs:
        return None, ("no OpenCL platform/device found (pip install 'tessera[opencl]' brings pyopencl and "
                      "PoCL; a device's vendor driver registers itself with the ICD loader)")
    if spec:
        # an index ("N" in the flat list, or "P:D") first, over every device, and only then a name
        # substring: "2" must pick device 2, not an earlier device whose name contains a 2
        for i, (label, _, _) in enumerate(devs):
            if spec == str(i) or label.startswith(spec + " "):
                return devs[i], ""
        for i, (label, _, _) in enumerate(devs):
            if spec.lower() in label.split(" ", 1)[1].lower():
                return devs[i], ""
        return None, (f"TESSERA_OPENCL_DEVICE={spec!r} matches no device (an index N, P:D or a name "
                      f"substring); devices: " + "; ".join(f"{i}: {label}" for i, (label, _, _) in enumerate(devs)))
    cl = _cl()
    usable = [d for d in devs if "oclgrind" not in d[0].lower()]
    gpus = [d for d in usable if d[2].type & cl.device_type.GPU]
    if gpus or usable:
        return (gpus or usable)[0], ""
    return None, "the only OpenCL device is the Oclgrind simulator; select it with TESSERA_OPENCL_DEVICE=oclgrind"


class Runtime:
    """One device's context, in-order queue, capabilities and program memo."""

    def __init__(self, label: str, platform, device):
        cl = _cl()
        self.label, self.platform, self.device = label, platform, device
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx, device)
        self.extensions = frozenset(device.extensions.split())
        self.fp16 = "cl_khr_fp16" in self.extensions
        self.max_wg = int(device.max_work_group_size)
        self.key = "|".join([platform.name, platform.version, device.name, device.version,
                             device.driver_version, device.opencl_c_version])
        self.programs: dict[tuple, object] = {}
        self._zero_copy: bool | None = None

    @property
    def zero_copy(self) -> bool:
        """Does a kernel's write to a USE_HOST_PTR buffer land in host memory without a map?

        Probed once per device on an unaligned view (the worst case for a driver that only
        shares aligned allocations).  True on PoCL's CPU device and on unified-memory GPUs that
        honour USE_HOST_PTR; when False every launch maps its written buffers back (a copy)."""
        if self._zero_copy is None:
            import numpy as np
            cl = _cl()
            host = np.zeros(67, dtype=np.float32)
            view = host[3:]
            prg = cl.Program(self.ctx, "__kernel void tsr_probe(__global float *y) "
                                       "{ y[get_global_id(0)] = 42.0f; }").build()
            buf = cl.Buffer(self.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=view)
            prg.tsr_probe(self.queue, (64,), None, buf)
            self.queue.finish()
            self._zero_copy = bool((view == 42.0).all() and (host[:3] == 0).all())
            if not self._zero_copy:  # leave the probe's buffer consistent before it is released
                arr, _ = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.READ, 0, (256,), np.uint8)
                arr.base.release(self.queue)
        return self._zero_copy


_runtimes: dict[str, Runtime] = {}


def runtime() -> Runtime:
    spec = _env.get("TESSERA_OPENCL_DEVICE")
    rt = _runtimes.get(spec)
    if rt is None:
        dev, why = _pick(spec)
        if dev is None:
            raise RuntimeError(f"tessera opencl backend: {why}")
        rt = _runtimes[spec] = Runtime(*dev)
    return rt


def available(device: torch.device) -> tuple[bool, str]:
    if device.type != "cpu":
        return False, (f"the opencl backend runs on CPU tensors (zero-copy host memory shared with the "
                       f"OpenCL device), got device {device}")
    if not _importable():
        return False, "pyopencl is not installed (pip install 'tessera[opencl]')"
    dev, why = _pick(_env.get("TESSERA_OPENCL_DEVICE"))
    return (dev is not None), why


def portable() -> bool:
    """True when kernels must not use optional extensions (forced by TESSERA_OPENCL_PORTABLE=1)."""
    return _env.get("TESSERA_OPENCL_PORTABLE") == "1"


# TESSERA_OPENCL_EMULATE's names (tests only) -> the FEATURES key they emulate
EMULABLE = {"subgroups": "subgroups", "int_dot": "integer_dot_product", "integer_dot_product": "integer_dot_product"}


def emulated() -> frozenset:
    """The features whose built-ins ``csrc/opencl/tessera_cl_emulate.h`` supplies (TESSERA_OPENCL_EMULATE,
    comma-separated: ``subgroups``, ``int_dot``): for tests, which run the kernels' extension paths on
    a device without the extensions.  Ignored under TESSERA_OPENCL_PORTABLE=1."""
    spec = _env.get("TESSERA_OPENCL_EMULATE")
    if not spec:
        return frozenset()
    out = set()
    for name in filter(None, (n.strip().lower() for n in spec.split(","))):
        if name not in EMULABLE:
            raise ValueError(f"TESSERA_OPENCL_EMULATE={spec!r}: unknown feature {name!r} "
                             f"(known: {', '.join(sorted(EMULABLE))})")
        out.add(EMULABLE[name])
    return frozenset(out)


def paths(rt: "Runtime | None" = None) -> dict:
    """The path each optional feature takes in the kernels built now: ``"device"`` (the device's
    extension), ``"emulated"`` (tessera_cl_emulate.h, tests) or ``"portable"`` -- for fp16
    arithmetic, sub-group reductions and integer dot products (`tessera info` prints it)."""
    rt = rt or runtime()
    if portable():
        return {f: "portable" for f in FEATURES}
    emu = emulated()
    out = {}
    for f, names in FEATURES.items():
        has = any(n in rt.extensions for n in names)
        out[f] = "emulated" if f in emu else "device" if has else "portable"
    return out


def _cl_std(rt: Runtime, feats: dict) -> str:
    """-cl-std of a build: OpenCL C 1.2, the kernels' language, unless a device extension path
    needs the built-ins a compiler declares only for OpenCL C >= 2.0 (cl_khr_subgroups without
    cl_intel_subgroups, cl_khr_integer_dot_product): then the device's own OpenCL C version
    (kernels written for 1.2 are valid OpenCL C 2.0 / 3.0)."""
    needs = feats.get("integer_dot_product") == "device" or (
        feats.get("subgroups") == "device" and "cl_intel_subgroups" not in rt.extensions)
    if needs:
        try:
            major, minor = rt.device.opencl_c_version.split()[2].split(".")[:2]
            if int(major) >= 2:
                return f"CL{int(major)}.{int(minor)}"
        except (IndexError, ValueError):
            pass
    return "CL1.2"


# ----------------------------------------------------------------------------- programs

def _source_hash(source: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(CL_SRC.glob("*.h")) + sorted(source.parent.glob("*.h")) + [source]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


_hashes: dict[Path, str] = {}


def program(source: Path, defines: dict | None = None):
    """The built program of ``source`` with ``-D`` ``defines`` for the current device.

    Memoised per process; binaries are cached on disk (see the module docstring)."""
    rt = runtime()
    defs = dict(defines or {})
    feats = paths(rt)
    defs["TSR_HAS_FP16"] = int(rt.fp16 and not portable())
    defs["TSR_PORTABLE"] = int(portable())  # recorded in the options (and the cache key) either way
    defs["TSR_HAS_SUBGROUPS"] = int(feats["subgroups"] != "portable")
    defs["TSR_HAS_INT_DOT"] = int(feats["integer_dot_product"] != "portable")
    if feats["subgroups"] == "emulated":   # tests only; in the options, so in the binary cache key
        defs["TSR_EMULATE_SUBGROUPS"] = 1
    if feats["integer_dot_product"] == "emulated":
        defs["TSR_EMULATE_INT_DOT"] = 1
    # -I the source's folder too: an op family's header beside its .cl (hashed into the key above)
    opts = [f"-cl-std={_cl_std(rt, feats)}", "-I", str(CL_SRC), "-I", str(source.parent)] + \
        [f"-D{k}={v}" for k, v in sorted(defs.items())]
    memo = (source, tuple(opts))
    prg = rt.programs.get(memo)
    if prg is None:
        prg = rt.programs[memo] = _build(rt, source, opts)
    return prg


def _build(rt: Runtime, source: Path, opts: list[str]):
    cl = _cl()
    digest = _hashes.get(source)
    if digest is None:
        digest = _hashes[source] = _source_hash(source)
    key = hashlib.sha256("\0".join([digest, " ".join(opts), rt.key]).encode()).hexdigest()[:20]
    root = _jit.cache_dir() / "opencl"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{source.stem}-{key}.bin"
    prg = _load(rt, target, opts)
    if prg is not None:
        return prg
    with open(root / f"{source.stem}-{key}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        try:
            prg = _load(rt, target, opts)  # another process may have built it while we waited
            if prg is not None:
                return prg
            prg = cl.Program(rt.ctx, source.read_text())
            try:
                prg.build(options=opts)
            except cl.RuntimeError as e:
                raise _jit.BuildError(f"building OpenCL program {source.name} for {rt.label} failed "
                                      f"(options {' '.join(opts)}):\n{e}") from None
            binary = prg.get_info(cl.program_info.BINARIES)[0]
            if binary:
                fd, tmp = tempfile.mkstemp(suffix=".tmp", dir=root)
                with os.fdopen(fd, "wb") as f:
                    f.write(_BIN_MAGIC + hashlib.sha256(binary).digest() + binary)
                os.replace(tmp, target)  # atomic: no reader sees half a binary
            return prg
        finally:
            fcntl.flock(lockf, fcntl.LOCK_UN)


# cache file = magic + sha256(binary) + the driver's binary.  The digest is checked before the driver
# sees the bytes: PoCL 3.0 segfaults on a truncated or bit-flipped binary instead of rejecting it,
# so a damaged cache file must never reach clCreateProgramWithBinary (it is rebuilt instead).
_BIN_MAGIC = b"tessera-opencl-binary-1\n"


def _load(rt: Runtime, target: Path, opts: list[str]):
    """The program cached in ``target``, or None (absent, damaged, foreign or stale: rebuild)."""
    try:
        data = target.read_bytes()
    except FileNotFoundError:
        return None
    n = len(_BIN_MAGIC)
    digest, binary = data[n:n + 32], data[n + 32:]
    if not data.startswith(_BIN_MAGIC) or not binary or hashlib.sha256(binary).digest() != digest:
        return None
    return _from_binary(rt, binary, opts)


def _from_binary(rt: Runtime, binary: bytes, opts: list[str]):
    cl = _cl()
    try:
        prg = cl.Program(rt.ctx, [rt.device], [binary])
        prg.build(options=opts)
        return prg
    except cl.Error:
        return None  # a stale or foreign binary: rebuild from source


# ----------------------------------------------------------------------------- buffers, launch

def span_bytes(t: torch.Tensor) -> int:
    """Bytes from a view's first element to the end of its last one (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return (last + 1) * t.element_size()


def buffer(t: torch.Tensor | None):
    """A zero-copy buffer over exactly the memory of view ``t`` (None -> a 1-byte dummy buffer,
    for optional arguments the kernel is told to ignore: OpenCL has no null buffer argument)."""
    cl = _cl()
    rt = runtime()
    if t is None or t.numel() == 0:
        return _dummy(rt)
    if t.device.type != "cpu":
        raise ValueError(f"tessera opencl backend: tensors must be on the CPU (shared memory), got {t.device}")
    n = span_bytes(t)
    host = (ctypes.c_char * n).from_address(t.data_ptr())
    return cl.Buffer(rt.ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=host)


def _dummy(rt: Runtime):
    b = getattr(rt, "_dummy", None)
    if b is None:
        cl = _cl()
        b = rt._dummy = cl.Buffer(rt.ctx, cl.mem_flags.READ_WRITE, 16)
    return b


def kernel(prg, name: str):
    """A kernel object, memoised on the program (clCreateKernel per call costs ~10 us)."""
    cache = prg.__dict__.setdefault("_tsr_kernels", {}) if hasattr(prg, "__dict__") else {}
    k = cache.get(name)
    if k is None:
        # (cl.Kernel(prg, name), as pyopencl recommends: getattr(prg, name) goes through
        # Program.__getattr__, which counts retrievals and warns on the second)
        k = cache[name] = _cl().Kernel(prg, name)
    return k


def launch(prg, name: str, global_size, local_size, args, written=()):
    """Run kernel ``name`` over ``global_size`` (work-group ``local_size`` or None) and make the
    buffers in ``written`` visible to the host (map + unmap: free when zero-copy)."""
    cl = _cl()
    rt = runtime()
    k = kernel(prg, name)
    k.set_args(*args)
    cl.enqueue_nd_range_kernel(rt.queue, k, tuple(global_size), None if local_size is None else tuple(local_size))
    if not rt.zero_copy:
        for b in written:
            if b is not None:
                arr, _ = cl.enqueue_map_buffer(rt.queue, b, cl.map_flags.READ, 0, (b.size,), "uint8")
                arr.base.release(rt.queue)  # unmap: the host copy is now current
    rt.queue.finish()


def i64(v: int):
    import numpy as np
    return np.int64(v)


def i32(v: int):
    import numpy as np
    return np.int32(v)


def f32(v: float):
    import numpy as np
    return np.float32(v)


def round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# extensions the kernels use where present (and the portable paths replace), as `tessera info` shows them
FEATURES = {"fp16": ("cl_khr_fp16",), "subgroups": ("cl_khr_subgroups", "cl_intel_subgroups"),
            "integer_dot_product": ("cl_khr_integer_dot_product",)}


def _device_type(d) -> str:
    cl = _cl()
    names = [n for n in ("GPU", "CPU", "ACCELERATOR", "CUSTOM") if d.type & getattr(cl.device_type, n, 0)]
    return "|".join(names) or str(d.type)


def _safe(get, default=None):
    try:
        return get()
    except Exception:  # an optional query a driver does not answer (deprecated, or OpenCL 1.x)
        return default


def describe(probe: bool = True) -> dict:
    """What ``tessera info`` prints: every platform and device (OpenCL C version, extensions, the
    features the kernels use, unified memory), the device the backend selects and, with ``probe``,
    the selected device's zero-copy probe (this creates its context: only ``info`` calls it)."""
    info = {"installed": _importable(), "pyopencl": None, "platforms": [], "devices": [], "selected": None,
            "portable": portable(), "env": _env.get("TESSERA_OPENCL_DEVICE")}
    if info["installed"]:
        info["pyopencl"] = _cl().VERSION_TEXT
    seen = {}
    for label, p, d in devices():
        pi = label.split(":", 1)[0]
        if pi not in seen:
            seen[pi] = {"index": int(pi), "name": p.name.strip(), "vendor": p.vendor.strip(), "version": p.version.strip()}
            info["platforms"].append(seen[pi])
        exts = sorted(d.extensions.split())
        info["devices"].append({
            "label": label, "index": len(info["devices"]), "type": _device_type(d),
            "opencl_c": d.opencl_c_version.strip(), "version": d.version.strip(), "driver": d.driver_version.strip(),
            "compute_units": int(d.max_compute_units), "max_work_group_size": int(d.max_work_group_size),
            "global_mem_mib": int(d.global_mem_size) >> 20, "max_alloc_mib": int(d.max_mem_alloc_size) >> 20,
            "unified_memory": _safe(lambda d=d: bool(d.host_unified_memory)),
            "svm_capabilities": _safe(lambda d=d: int(d.svm_capabilities), 0),
            "features": {f: any(e in exts for e in names) for f, names in FEATURES.items()},
            "extensions": exts})
    dev, why = _pick(_env.get("TESSERA_OPENCL_DEVICE")) if info["installed"] else (None, "pyopencl is not installed")
    info["selected"] = dev[0] if dev else None
    info["why_not"] = why
    if dev is not None and probe:
        try:
            rt = runtime()
            info["zero_copy"] = rt.zero_copy
            info["fp16_arithmetic"] = bool(rt.fp16 and not portable())
            info["paths"] = paths(rt)
        except Exception as e:  # a device that lists but cannot create a context: show why
            info["zero_copy"] = f"probe failed: {type(e).__name__}: {e}"
    return info


def local_floats(n: int):
    """A ``__local float[n]`` kernel argument (work-group scratch)."""
    return _cl().LocalMemory(4 * n)


def row_local_size(n: int) -> int:
    """Work-group size for a one-group-per-row kernel: a power of two, at most 256 and the device's
    limit, and no wider than the row needs (a row of 7 gets 8 work-items, not 256 idle ones)."""
    cap = min(256, runtime().max_wg)
    L = 1
    while L < cap and L < n:
        L <<= 1
    return max(L, 1)


def vec_local_size(n: int) -> int:
    """Work-group size for a row kernel whose work-items take 8-element chunks (tsr_ld8/tsr_st8)
    of an ``n``-element row: 1 on a CPU device -- PoCL vectorises across work-items only in
    loop-free regions, while one work-item's float8 loop is already SIMD code (8192x4096 fp32
    RMSNorm: 1 work-item per row ran ~2x faster than 64) -- else ``row_local_size`` of the chunks.
    A device that says it is both (Oclgrind reports every type) gets the GPU geometry, so the
    simulator checks the multi-work-item paths for races."""
    rt = runtime()
    cpu = rt.__dict__.get("_tsr_cpu")
    if cpu is None:
        t = _cl().device_type
        cpu = rt._tsr_cpu = bool(rt.device.type & t.CPU) and not rt.device.type & t.GPU
    if cpu and _env.get("TESSERA_OPENCL_EMULATE") and paths(rt)["subgroups"] == "emulated":
        cpu = False   # tests: emulated sub-groups need several per work-group (the combine step)
    return 1 if cpu else row_local_size(-(-n // 8))


def row_groups(m: int) -> int:
    """Work-groups for a kernel that walks blocks of rows and keeps per-group partial sums (a
    parameter gradient): enough to fill the device, few enough that the partials stay small."""
    cu = int(runtime().device.max_compute_units)
    return max(1, min(m, 8 * cu, 256))
