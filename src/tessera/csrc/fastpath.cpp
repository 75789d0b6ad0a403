// _tsr_fastpath: the plain eager call of a few hot cpu ops, done in C++ (issue #16 item 4).
//
// Why: a tiny eager call of PyTorch's own ops costs ~1-3 us here (pybind -> ATen); tessera's
// Python glue (argument checks, backend selection, one torch.empty per output at ~1 us each,
// the ctypes/ffi launch) cost 9-29 us for the same call.  Each function below is the
// undecorated Python body of one op (`_<op>_impl` in ops/<op>/__init__.py) for the one case
// that dominates inference: every tensor contiguous, on the CPU, a supported dtype, the cpu
// backend chosen automatically.  It allocates the outputs with ATen and calls the same C
// kernel entry point the Python launcher calls, with the same arguments; anything else
// (another layout, a backend request, an argument the Python checks would reject, a kernel
// error) is handed unchanged to the Python body, which handles or rejects it as before.
//
// _library.direct() decides whether this body may run at all (no autograd, tracing, modes,
// subclasses, poisoning or fenced placement: exactly when the Python body may run without
// the custom op), so autograd, torch.compile/export, opcheck and fake tensors never see it.
//
// Kernels are found by name: cpu.declare() tells this module each kernel entry point's
// address and the ISA library it came from (note()); a call runs only while the ISA the cpu
// backend would pick now (TESSERA_CPU_ISA, else the best) is the one noted.
//
// Glue, not a kernel: the kernels stay framework-free C; this file is what touches torch.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/python.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// kernels (C entry points) and the Python bodies they stand in for
enum Slot { ACT_FWD, SOFTMAX_FWD, LAYER_NORM_FWD, RMS_NORM_FWD, GLU_FWD, QI8_MM, CONV_FWD, CONV_FWD_DW, CONV_PACK,
            RQ_MM, RQ_IM2COL, RQ_TRANSPOSE, RQ_DW, RQ_DW_K3, ADD_I8, RQ_CONV, NSLOTS };
const char *SLOT_NAMES[NSLOTS] = {"tsr_act_fwd", "tsr_softmax_fwd", "tsr_layer_norm_fwd", "tsr_rms_norm_fwd",
                                  "tsr_glu_fwd", "tsr_qi8_mm", "tsr_conv2d_fwd", "tsr_conv2d_fwd_dw",
                                  "tsr_conv2d_pack", "tsr_qi8_mm_rq", "tsr_im2col", "tsr_transpose_i8",
                                  "tsr_dw_requant", "tsr_dw_requant_k3", "tsr_add_int8", "tsr_qi8_conv_rq"};
enum Body { SILU, SOFTMAX, LAYER_NORM, RMS_NORM, GELU, SWIGLU, GEGLU, INT_MM, CONV2D, CONV2D_INT8, ADD_INT8, LINEAR_I8RQ,
            NBODIES };
enum ActKind { KIND_SILU = 0, KIND_GELU = 1, KIND_GELU_TANH = 2 };  // ops/_elementwise: SILU, GELU, GELU_TANH

struct Kernel {
  void *fn = nullptr;
  std::string isa;
};
constexpr int NISA = 4;             // one entry per ISA library (avx512, avx2, generic, spare)
Kernel g_kernels[NSLOTS][NISA];
std::string g_best_isa;            // cpu.isa() without TESSERA_CPU_ISA
int64_t g_nt_min_bytes = 8 << 20;  // cpu.NT_MIN_BYTES
int64_t g_parallel_min = 1 << 15;  // cpu.PARALLEL_MIN_ELEMENTS
int64_t g_softmax_scratch = 1 << 16;
int64_t g_qi8_max_k = 0;           // _qlinear_int8.MAX_K (int32 accumulators' bound)
PyObject *g_override = nullptr;    // _registry._override (a contextvars.ContextVar)
// the Python bodies (the exact path for everything else); held for the life of the process, never
// released (a static py::object would be destroyed after the interpreter, at exit)
PyObject *g_impl[NBODIES] = {};
int64_t g_calls = 0;               // calls that ran here (tests prove the path is taken)

// "" (automatic) or "cpu": a backend name the cpu kernels answer on a CPU tensor
bool is_cpu_request(PyObject *s) {
  return PyUnicode_Check(s) && (PyUnicode_GET_LENGTH(s) == 0 || PyUnicode_CompareWithASCIIString(s, "cpu") == 0);
}

// Would the backend _registry.select() picks run on the cpu kernels now?  use_backend() first,
// then TESSERA_BACKEND; "" is automatic (cpu, on a CPU tensor) and "cpu" asks for it by name.
bool cpu_chosen() {
  if (g_override) {
    PyObject *v = nullptr;
    if (PyContextVar_Get(g_override, nullptr, &v) < 0) {
      PyErr_Clear();
      return false;
    }
    int ok = v && is_cpu_request(v);
    bool set = v && PyUnicode_Check(v) && PyUnicode_GET_LENGTH(v) > 0;
    Py_XDECREF(v);
    if (set) return ok;
  }
  const char *env = std::getenv("TESSERA_BACKEND");
  return !(env && *env && std::strcmp(env, "cpu") != 0);
}

// The kernel of `slot` when the cpu backend would run it now, else null.
void *kernel(Slot slot) {
  const char *forced = std::getenv("TESSERA_CPU_ISA");
  const char *isa = (forced && *forced) ? forced : g_best_isa.c_str();
  void *fn = nullptr;
  for (const Kernel &k : g_kernels[slot])
    if (k.fn != nullptr && k.isa == isa) fn = k.fn;
  return fn != nullptr && cpu_chosen() ? fn : nullptr;
}


int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kHalf: return 1;
    case at::kBFloat16: return 2;
    default: return -1;
  }
}

// x as a plain contiguous CPU tensor of a supported float dtype with a non-empty last dim.
bool plain(py::handle obj, at::Tensor &out) {
  if (!THPVariable_CheckExact(obj.ptr())) return false;
  const at::Tensor &t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu() || dtype_code(t.scalar_type()) < 0 || t.dim() < 1 || !t.is_contiguous() ||
      t.numel() == 0)
    return false;
  out = t;
  return true;
}

// an int8 / int16 contiguous CPU tensor (the integer matmul's operands)
bool plain_int(py::handle obj, at::Tensor &out) {
  if (!THPVariable_CheckExact(obj.ptr())) return false;
  const at::Tensor &t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu() || !(t.scalar_type() == at::kChar || t.scalar_type() == at::kShort) ||
      !t.is_contiguous())
    return false;
  out = t;
  return true;
}

// exactly torch.nn.Parameter (not a subclass): a model's weights, plain tensors for this purpose
// (Parameter has no __torch_function__ of its own; _library.direct accepts it too)
bool is_parameter(py::handle obj) {
  static PyObject *type = py::object(py::module_::import("torch.nn").attr("Parameter")).release().ptr();
  return (PyObject *)Py_TYPE(obj.ptr()) == type;
}

// weight/bias: None, or a 1-D float CPU tensor of size n, handed to the kernel as contiguous
// fp32 (_library.as_fp32_param: a copy only when it is not already that)
bool param(py::handle obj, int64_t n, at::Tensor &out) {
  if (obj.is_none()) return true;
  if (!THPVariable_CheckExact(obj.ptr()) && !is_parameter(obj)) return false;
  const at::Tensor &t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu() || dtype_code(t.scalar_type()) < 0 || t.dim() != 1 || t.size(0) != n) return false;
  out = t.to(at::kFloat).contiguous();
  return true;
}

// residual: None, or x's shape, dtype and device, contiguous
bool residual_of(py::handle obj, const at::Tensor &x, at::Tensor &out) {
  if (obj.is_none()) return true;
  if (!THPVariable_CheckExact(obj.ptr())) return false;
  const at::Tensor &t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu() || t.scalar_type() != x.scalar_type() || !t.sizes().equals(x.sizes()) ||
      !t.is_contiguous())
    return false;
  out = t;
  return true;
}

// eps: an int or float (not bool), finite and >= 0 (_checks.finite_float(min_value=0))
bool eps_of(py::handle obj, float &eps) {
  PyObject *o = obj.ptr();
  if (PyBool_Check(o) || !(PyFloat_Check(o) || PyLong_Check(o))) return false;
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  if (!std::isfinite(v) || v < 0.0) return false;
  eps = (float)v;
  return true;
}

// TESSERA_QI8_VNNI as the int8 kernels' vnni_ok (_qlinear_int8.cpu._vnni_ok): 0 portable C, 2 VNNI
// even where AMX exists, 1 (default) the best the CPU has
int vnni_ok() {
  const char *v = std::getenv("TESSERA_QI8_VNNI");
  return !v ? 1 : std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "2") == 0 ? 2 : 1;
}

int threads_for(int64_t numel) { return numel < g_parallel_min ? 1 : std::max(1, at::get_num_threads()); }
int use_nt(const at::Tensor &out) { return out.numel() * (int64_t)out.element_size() >= g_nt_min_bytes; }
void *ptr(const at::Tensor &t) { return t.defined() ? t.data_ptr() : nullptr; }

// run a kernel call, without the GIL when the call is big enough to be worth a switch
template <class F>
int launch(int64_t numel, F &&f) {
  if (numel >= g_parallel_min) {
    py::gil_scoped_release nogil;
    return f();
  }
  return f();
}

// y = act(x) for silu / gelu (kind: ActKind); nullptr-free result or an empty object (not taken)
py::object act_fwd(py::handle x_obj, int kind, py::handle backend) {
  at::Tensor x;
  void *fn = is_cpu_request(backend.ptr()) && plain(x_obj, x) ? kernel(ACT_FWD) : nullptr;
  if (fn) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    at::Tensor y = at::empty(x.sizes(), x.options());
    using F = int (*)(const void *, int64_t, void *, int64_t, int64_t, int, int, int, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(x.data_ptr(), N, y.data_ptr(), M, N, kind, dtype_code(x.scalar_type()), use_nt(y),
                     threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }
  }
  return py::object();
}

// out = act(gate) * up for swiglu / geglu: both contiguous, same shape and dtype
py::object glu_fwd(py::handle g_obj, py::handle u_obj, int kind, py::handle backend) {
  at::Tensor g, u;
  void *fn = is_cpu_request(backend.ptr()) && plain(g_obj, g) && plain(u_obj, u) ? kernel(GLU_FWD) : nullptr;
  if (fn && (u.scalar_type() != g.scalar_type() || !u.sizes().equals(g.sizes()))) fn = nullptr;
  if (fn) {
    const int64_t N = g.size(-1), M = g.numel() / N;
    at::Tensor y = at::empty(g.sizes(), g.options());
    using F = int (*)(const void *, int64_t, const void *, int64_t, void *, int64_t, int64_t, int, int, int, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(g.data_ptr(), N, u.data_ptr(), N, y.data_ptr(), M, N, kind, dtype_code(g.scalar_type()),
                     use_nt(y), threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }
  }
  return py::object();
}

// int_mm: a [M, K] int8/int16 and b [N, K] int8, both contiguous -> int32 / int64 (exact);
// the same call as _qlinear_int8.cpu.int_mm_forward
py::object int_mm(py::handle a_obj, py::handle b_obj, py::handle backend) {
  at::Tensor a, b;
  void *fn = is_cpu_request(backend.ptr()) && plain_int(a_obj, a) && plain_int(b_obj, b) ? kernel(QI8_MM) : nullptr;
  if (fn && (a.dim() != 2 || b.dim() != 2 || b.scalar_type() != at::kChar || a.size(1) != b.size(1) ||
             a.size(0) == 0 || b.size(0) == 0 || a.size(1) > g_qi8_max_k))
    fn = nullptr;
  if (fn) {
    const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
    const bool i8 = a.scalar_type() == at::kChar;
    at::Tensor y = at::empty({M, N}, a.options().dtype(i8 ? at::kInt : at::kLong));
    const int vnni = vnni_ok(), bits = i8 ? 8 : 16;
    using F = int (*)(const void *, int64_t, int, int, int64_t, int64_t, const void *, int64_t, const void *,
                      const void *, int, void *, int, int, int);
    int rc = launch(M * N * K, [&] {
      return ((F)fn)(a.data_ptr(), K, bits, bits, M, K, b.data_ptr(), N, nullptr, nullptr, /*no activation*/ 0,
                     y.data_ptr(), /*integer output*/ -1, vnni, threads_for(std::max<int64_t>(M, 16) * N * K / 16));
    });
    if (rc == 0) {
      g_calls++;
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }
  }
  return py::handle(g_impl[INT_MM])(a_obj, b_obj, backend);
}

// approximate: exactly "none" or "tanh" (anything else: the Python body says what is wrong)
int gelu_kind(py::handle approximate) {
  PyObject *a = approximate.ptr();
  if (!PyUnicode_CheckExact(a)) return -1;
  if (PyUnicode_CompareWithASCIIString(a, "none") == 0) return KIND_GELU;
  if (PyUnicode_CompareWithASCIIString(a, "tanh") == 0) return KIND_GELU_TANH;
  return -1;
}

py::object silu(py::handle x, py::handle backend) {
  py::object y = act_fwd(x, KIND_SILU, backend);
  return y ? y : py::handle(g_impl[SILU])(x, backend);
}

py::object gelu(py::handle x, py::handle approximate, py::handle backend) {
  int kind = gelu_kind(approximate);
  py::object y = kind < 0 ? py::object() : act_fwd(x, kind, backend);
  return y ? y : py::handle(g_impl[GELU])(x, approximate, backend);
}

py::object swiglu(py::handle gate, py::handle up, py::handle backend) {
  py::object y = glu_fwd(gate, up, KIND_SILU, backend);
  return y ? y : py::handle(g_impl[SWIGLU])(gate, up, backend);
}

py::object geglu(py::handle gate, py::handle up, py::handle approximate, py::handle backend) {
  int kind = gelu_kind(approximate);
  py::object y = kind < 0 ? py::object() : glu_fwd(gate, up, kind, backend);
  return y ? y : py::handle(g_impl[GEGLU])(gate, up, approximate, backend);
}

py::object softmax(py::handle x_obj, py::handle dim, py::handle backend) {
  at::Tensor x;
  void *fn = is_cpu_request(backend.ptr()) && PyLong_CheckExact(dim.ptr()) && plain(x_obj, x) ? kernel(SOFTMAX_FWD) : nullptr;
  if (fn) {
    long d = PyLong_AsLong(dim.ptr());
    if (PyErr_Occurred()) PyErr_Clear(), d = 0;
    if (d != -1 && d != x.dim() - 1) fn = nullptr;  // another dim: the Python body moves it last
  }
  if (fn) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    at::Tensor y = at::empty(x.sizes(), x.options());
    using F = int (*)(const void *, int64_t, void *, int64_t, int64_t, int, int, int64_t, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(x.data_ptr(), N, y.data_ptr(), M, N, dtype_code(x.scalar_type()), use_nt(y), g_softmax_scratch,
                     threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }
  }
  return py::handle(g_impl[SOFTMAX])(x_obj, dim, backend);
}

py::object wrap(const at::Tensor &t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(t)); }

py::object layer_norm(py::handle x_obj, py::handle w_obj, py::handle b_obj, py::handle r_obj, py::handle eps_obj,
                      py::handle backend) {
  at::Tensor x, w, b, r;
  float eps = 0.f;
  void *fn = is_cpu_request(backend.ptr()) && plain(x_obj, x) && eps_of(eps_obj, eps) ? kernel(LAYER_NORM_FWD) : nullptr;
  if (fn && !(param(w_obj, x.size(-1), w) && param(b_obj, x.size(-1), b) && residual_of(r_obj, x, r))) fn = nullptr;
  if (fn) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    auto rows = x.sizes().slice(0, x.dim() - 1);
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor h = r.defined() ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
    at::Tensor mean = at::empty(rows, x.options().dtype(at::kFloat));
    at::Tensor rstd = at::empty(rows, x.options().dtype(at::kFloat));
    using F = int (*)(const void *, int64_t, const void *, int64_t, const void *, const void *, void *, void *, void *,
                      void *, int64_t, int64_t, float, int, int, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(x.data_ptr(), N, ptr(r), r.defined() ? N : 0, ptr(w), ptr(b), y.data_ptr(),
                     r.defined() ? h.data_ptr() : nullptr, mean.data_ptr(), rstd.data_ptr(), M, N, eps,
                     dtype_code(x.scalar_type()), use_nt(y), threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::make_tuple(wrap(y), wrap(h), wrap(mean), wrap(rstd));
    }
  }
  return py::handle(g_impl[LAYER_NORM])(x_obj, w_obj, b_obj, r_obj, eps_obj, backend);
}

py::object rms_norm(py::handle x_obj, py::handle w_obj, py::handle r_obj, py::handle eps_obj, py::handle backend) {
  at::Tensor x, w, r;
  float eps = 0.f;
  void *fn = is_cpu_request(backend.ptr()) && plain(x_obj, x) && eps_of(eps_obj, eps) ? kernel(RMS_NORM_FWD) : nullptr;
  if (fn && !(param(w_obj, x.size(-1), w) && residual_of(r_obj, x, r))) fn = nullptr;
  if (fn) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    at::Tensor y = at::empty(x.sizes(), x.options());
    at::Tensor h = r.defined() ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
    at::Tensor rstd = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
    using F = int (*)(const void *, int64_t, const void *, int64_t, const void *, void *, void *, void *, int64_t,
                      int64_t, float, int, int, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(x.data_ptr(), N, ptr(r), r.defined() ? N : 0, ptr(w), y.data_ptr(),
                     r.defined() ? h.data_ptr() : nullptr, rstd.data_ptr(), M, N, eps, dtype_code(x.scalar_type()),
                     use_nt(y), threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::make_tuple(wrap(y), wrap(h), wrap(rstd));
    }
  }
  return py::handle(g_impl[RMS_NORM])(x_obj, w_obj, r_obj, eps_obj, backend);
}

// a plain Python int (not a bool) in [lo, hi]
bool int_in(py::handle obj, int64_t lo, int64_t hi, int64_t &v) {
  PyObject *o = obj.ptr();
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  v = x;
  return x >= lo && x <= hi;
}

// add_int8 (ops/add_int8, _add_int8_impl's arguments): a and b cpu int8 / int16 tensors of one shape, both contiguous or both
// channels-last with a not also contiguous (the op's output layout rule), every parameter a plain
// int inside _resolve's ranges (the left shift's int32 bound included).  Anything else -- broadcasting,
// other layouts, empty tensors, a bad value -- runs the Python body, which also raises the errors.
py::object add_int8(py::handle a_obj, py::handle b_obj, py::handle za_o, py::handle ma_o, py::handle sa_o,
                    py::handle zb_o, py::handle mb_o, py::handle sb_o, py::handle mo_o, py::handle so_o,
                    py::handle zo_o, py::handle qmin_o, py::handle qmax_o, py::handle left_o, py::handle backend) {
  void *fn = is_cpu_request(backend.ptr()) && THPVariable_CheckExact(a_obj.ptr()) && THPVariable_CheckExact(b_obj.ptr())
                 ? kernel(ADD_I8) : nullptr;
  if (fn) {
    const at::Tensor &a = THPVariable_Unpack(a_obj.ptr()), &b = THPVariable_Unpack(b_obj.ptr());
    const bool i16 = a.scalar_type() == at::kShort;
    const int64_t lo = i16 ? -32768 : -128, hi = i16 ? 32767 : 127, i32 = INT32_MAX;
    int64_t za, ma, sa, zb, mb, sb, mo, so, zo, qmin, qmax, left;
    bool ok = a.device().is_cpu() && b.device().is_cpu() && (i16 || a.scalar_type() == at::kChar) &&
              b.scalar_type() == a.scalar_type() && a.sizes().equals(b.sizes()) && a.dim() >= 1 && a.numel() > 0 &&
              int_in(za_o, lo, hi, za) && int_in(zb_o, lo, hi, zb) && int_in(zo_o, lo, hi, zo) &&
              int_in(ma_o, -i32 - 1, i32, ma) && int_in(mb_o, -i32 - 1, i32, mb) && int_in(mo_o, -i32 - 1, i32, mo) &&
              int_in(sa_o, -31, 30, sa) && int_in(sb_o, -31, 30, sb) && int_in(so_o, -31, 30, so) &&
              int_in(qmin_o, lo, hi, qmin) && int_in(qmax_o, qmin, hi, qmax) && int_in(left_o, 0, 30, left) &&
              (std::max(hi - std::min(za, zb), std::max(za, zb) - lo) << left) <= i32;
    const bool cl = a.dim() == 4 && !a.is_contiguous() && a.is_contiguous(at::MemoryFormat::ChannelsLast);
    if (ok && (cl ? b.is_contiguous(at::MemoryFormat::ChannelsLast) : a.is_contiguous() && b.is_contiguous())) {
      at::Tensor y = cl ? at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::ChannelsLast))
                        : at::empty(a.sizes(), a.options());
      const char *t = std::getenv("TESSERA_ADD_INT8_TABLE");   // cpu.py: _env.get(..., "1") != "0"
      const int table = !(t && std::strcmp(t, "0") == 0);
      const int64_t n = a.numel();
      using F = int (*)(const void *, const void *, int64_t, int, int, int, int, int, int, int, int, int, int, int,
                        int, int, int, void *, int);
      int rc = launch(n, [&] {
        return ((F)fn)(a.data_ptr(), b.data_ptr(), n, i16 ? 16 : 8, (int)za, (int)ma, (int)sa, (int)zb, (int)mb,
                       (int)sb, (int)mo, (int)so, (int)zo, (int)qmin, (int)qmax, (int)left, table, y.data_ptr(),
                       threads_for(n));
      });
      if (rc == 0) {
        g_calls++;
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
      }
    }
  }
  return py::handle(g_impl[ADD_INT8])(a_obj, b_obj, za_o, ma_o, sa_o, zb_o, mb_o, sb_o, mo_o, so_o, zo_o, qmin_o,
                                      qmax_o, left_o, backend);
}

#include "fastpath_conv2d.h"
#include "fastpath_conv2d_int8.h"
#include "fastpath_linear_int8.h"

// note(name, isa, address): a kernel entry point cpu.declare() has resolved; unknown names are ignored
void note(const std::string &name, const std::string &isa, uint64_t address) {
  for (int s = 0; s < NSLOTS; s++) {
    if (name != SLOT_NAMES[s]) continue;
    for (Kernel &k : g_kernels[s]) {
      if (k.fn == nullptr || k.isa == isa) {  // a rebuilt library of the same ISA replaces it
        k = Kernel{(void *)(uintptr_t)address, isa};
        break;
      }
    }
  }
}

// configure(...): the cpu backend's constants and the Python bodies ({op name: body}), once at load
void configure(const std::string &best_isa, int64_t nt_min_bytes, int64_t parallel_min, int64_t softmax_scratch,
               int64_t qi8_max_k, py::object override_var, py::dict impls) {
  static const char *names[NBODIES] = {"silu", "softmax", "layer_norm", "rms_norm", "gelu", "swiglu", "geglu",
                                       "int_mm", "conv2d", "conv2d_int8", "add_int8",
                                       "linear_int8_requant"};
  g_qi8_max_k = qi8_max_k;
  g_best_isa = best_isa;
  g_nt_min_bytes = nt_min_bytes;
  g_parallel_min = parallel_min;
  g_softmax_scratch = softmax_scratch;
  Py_XINCREF(override_var.ptr());
  g_override = override_var.ptr();
  for (int b = 0; b < NBODIES; b++) g_impl[b] = py::object(impls[names[b]]).release().ptr();
}

// ----------------------------------------------------------------------------- the gate
// gate(op, impl, tensors): _library.direct()'s decision (its Python body is the specification
// and the path taken before this module loads), minus its first test, is_compiling(), which
// stays in Python where dynamo folds it.  The same queries, made in C++ (~0.15 us where the
// Python ones cost ~0.8 us, a quarter of a tiny call).
struct GateState {
  PyObject *globals = nullptr;  // _library's module dict: its flags are read at each call, as the
                                // Python body reads them (tests monkeypatch the names themselves)
  PyObject *always = nullptr, *poison = nullptr, *place = nullptr, *fast = nullptr;  // interned names
  PyObject *os = nullptr, *environ = nullptr;  // the os module, the process's os.environ
  PyObject *parameter = nullptr;               // torch.nn.Parameter
} g_gate;

// _library.<name>[0] (a one-item list), borrowed; null if it is missing or not a list
PyObject *flag(PyObject *name) {
  PyObject *lst = PyDict_GetItem(g_gate.globals, name);
  return lst && PyList_Check(lst) && PyList_GET_SIZE(lst) > 0 ? PyList_GET_ITEM(lst, 0) : nullptr;
}

bool truthy(PyObject *v) { return v && v != Py_None && v != Py_False && PyObject_IsTrue(v) == 1; }

// a METH_FASTCALL function (pybind11's argument handling alone cost ~0.4 us a call):
// gate(op, impl, *tensors) -> a new reference to op, impl or impl's C++ twin
PyObject *gate(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2) {
    PyErr_SetString(PyExc_TypeError, "gate(op, impl, *tensors)");
    return nullptr;
  }
  PyObject *op = args[0], *impl = args[1];
  if (truthy(flag(g_gate.always)) || torch::jit::tracer::isTracing() || torch::profiler::impl::profilerEnabled() ||
      c10::impl::TorchDispatchModeTLS::stack_len() > 0 || at::impl::torch_function_mode_enabled())
    return Py_NewRef(op);
  const bool grad = c10::GradMode::is_enabled();
  for (Py_ssize_t i = 2; i < nargs; i++) {
    PyObject *o = args[i];
    if (o == Py_None) continue;
    if (!THPVariable_CheckExact(o) && (PyObject *)Py_TYPE(o) != g_gate.parameter) return Py_NewRef(op);
    const at::Tensor &t = THPVariable_Unpack(o);
    if ((grad && t.requires_grad()) || !(t.is_cpu() || t.is_cuda()) ||
        t.key_set().has_any(c10::functorch_transforms_ks | c10::DispatchKeySet(c10::DispatchKey::Functionalize)))
      return Py_NewRef(op);
  }
  PyObject *place = flag(g_gate.place);
  if (truthy(flag(g_gate.poison)) || (place && place != Py_None)) return Py_NewRef(impl);
  PyObject *env = PyObject_GetAttrString(g_gate.os, "environ");
  Py_XDECREF(env);  // (the module keeps it alive; only its identity matters)
  if (env != g_gate.environ) {
    PyErr_Clear();
    return Py_NewRef(impl);
  }
  PyObject *fast = PyDict_GetItem(g_gate.globals, g_gate.fast);
  PyObject *twin = fast && PyDict_Check(fast) ? PyDict_GetItem(fast, impl) : nullptr;  // borrowed, or null
  return Py_NewRef(twin ? twin : impl);
}

PyMethodDef g_gate_def = {"gate", (PyCFunction)(void (*)(void))gate, METH_FASTCALL,
                          "_library.direct()'s decision in C++: op, impl or impl's C++ twin"};

void configure_gate(py::module_ library, py::module_ os, py::object environ, py::object parameter) {
  // held for the life of the process
  g_gate.globals = Py_NewRef(PyModule_GetDict(library.ptr()));
  g_gate.always = PyUnicode_InternFromString("_ALWAYS_DISPATCH");
  g_gate.poison = PyUnicode_InternFromString("_POISON");
  g_gate.place = PyUnicode_InternFromString("_PLACE");
  g_gate.fast = PyUnicode_InternFromString("_FAST");
  g_gate.os = Py_NewRef(os.ptr());
  g_gate.environ = Py_NewRef(environ.ptr());
  g_gate.parameter = Py_NewRef(parameter.ptr());
}

// ----------------------------------------------------------------------------- METH_FASTCALL entries
// The op bodies are called on every tiny eager call: as plain METH_FASTCALL functions they skip
// pybind11's overload dispatch and argument casting (~0.3 us of a ~1.5 us call).  A Python
// exception from the fallback body propagates; any C++ exception becomes a RuntimeError.
template <size_t N, class F, size_t... I>
PyObject *call_body(F f, PyObject *const *args, std::index_sequence<I...>) {
  try {
    return f(py::handle(args[I])...).release().ptr();
  } catch (py::error_already_set &e) {
    e.restore();
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

template <size_t N, auto F>
PyObject *fastcall(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != (Py_ssize_t)N) {
    PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", (Py_ssize_t)N, nargs);
    return nullptr;
  }
  return call_body<N>(F, args, std::make_index_sequence<N>{});
}

#define TSR_BODY(name, n) {#name, (PyCFunction)(void (*)(void))fastcall<n, name>, METH_FASTCALL, nullptr}
PyMethodDef g_bodies[] = {TSR_BODY(silu, 2),       TSR_BODY(softmax, 3), TSR_BODY(layer_norm, 6),
                          TSR_BODY(rms_norm, 5),   TSR_BODY(gelu, 3),    TSR_BODY(swiglu, 3),
                          TSR_BODY(geglu, 4),      TSR_BODY(int_mm, 3),  TSR_BODY(add_int8, 15),
                          // (conv2d, conv2d_int8, linear_int8_requant: METH_FASTCALL functions themselves, fastpath_*.h)
                          {"conv2d", (PyCFunction)(void (*)(void))conv2d, METH_FASTCALL, nullptr},
                          {"conv2d_int8", (PyCFunction)(void (*)(void))conv2d_int8, METH_FASTCALL, nullptr},
                          {"linear_int8_requant", (PyCFunction)(void (*)(void))linear_int8_requant, METH_FASTCALL,
                           nullptr},
                          {nullptr, nullptr, 0, nullptr}};
#undef TSR_BODY

}  // namespace

PYBIND11_MODULE(_tsr_fastpath, m) {
  m.def("configure", &configure);
  m.def("configure_gate", &configure_gate);
  m.add_object("gate", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&g_gate_def, nullptr, nullptr)));
  m.def("note", &note);
  for (PyMethodDef *d = g_bodies; d->ml_name; d++)
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_NewEx(d, nullptr, nullptr)));
  m.def("calls", [] { return g_calls; });
  m.def("configure_conv2d", &configure_conv2d);
  m.def("learn_conv2d", &learn_conv2d);
  m.def("conv2d_learned", &conv2d_learned);
  m.def("learn_conv2d_int8", &learn_conv2d_int8);
  m.def("conv2d_int8_learned", &conv2d_int8_learned);
  m.def("learn_linear_int8_requant", &learn_linear_int8_requant);
  m.def("linear_int8_requant_learned", &linear_int8_requant_learned);
}
