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
#include <torch/python.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace py = pybind11;

namespace {

enum Slot { ACT_FWD, SOFTMAX_FWD, LAYER_NORM_FWD, RMS_NORM_FWD, NSLOTS };
const char *SLOT_NAMES[NSLOTS] = {"tsr_act_fwd", "tsr_softmax_fwd", "tsr_layer_norm_fwd", "tsr_rms_norm_fwd"};

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
PyObject *g_override = nullptr;    // _registry._override (a contextvars.ContextVar)
// the Python bodies (the exact path for everything else); held for the life of the process, never
// released (a static py::object would be destroyed after the interpreter, at exit)
PyObject *g_impl[NSLOTS] = {};
int64_t g_calls = 0;               // calls that ran here (tests prove the path is taken)

// "" (automatic) or "cpu": a backend name the cpu kernels answer on a CPU tensor
bool is_cpu_request(PyObject *s) {
  return PyUnicode_Check(s) && (PyUnicode_GET_LENGTH(s) == 0 || PyUnicode_CompareWithASCIIString(s, "cpu") == 0);
}

// The kernel of `slot` when the cpu backend would run it now, else null.
void *kernel(Slot slot) {
  const char *forced = std::getenv("TESSERA_CPU_ISA");
  const char *isa = (forced && *forced) ? forced : g_best_isa.c_str();
  void *fn = nullptr;
  for (const Kernel &k : g_kernels[slot])
    if (k.fn != nullptr && k.isa == isa) fn = k.fn;
  if (fn == nullptr) return nullptr;
  // the backend _registry.select() would pick: use_backend() first, then TESSERA_BACKEND; "" is
  // automatic (cpu, on a CPU tensor, where its kernel was built) and "cpu" asks for it by name
  if (g_override) {
    PyObject *v = nullptr;
    if (PyContextVar_Get(g_override, nullptr, &v) < 0) {
      PyErr_Clear();
      return nullptr;
    }
    int ok = v && is_cpu_request(v);
    bool set = v && PyUnicode_Check(v) && PyUnicode_GET_LENGTH(v) > 0;
    Py_XDECREF(v);
    if (set) return ok ? fn : nullptr;
  }
  const char *env = std::getenv("TESSERA_BACKEND");
  if (env && *env && std::strcmp(env, "cpu") != 0) return nullptr;
  return fn;
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

py::object silu(py::handle x_obj, py::handle backend) {
  at::Tensor x;
  void *fn = is_cpu_request(backend.ptr()) && plain(x_obj, x) ? kernel(ACT_FWD) : nullptr;
  if (fn) {
    const int64_t N = x.size(-1), M = x.numel() / N;
    at::Tensor y = at::empty(x.sizes(), x.options());
    using F = int (*)(const void *, int64_t, void *, int64_t, int64_t, int, int, int, int);
    int rc = launch(M * N, [&] {
      return ((F)fn)(x.data_ptr(), N, y.data_ptr(), M, N, /*kind SILU*/ 0, dtype_code(x.scalar_type()), use_nt(y),
                     threads_for(M * N));
    });
    if (rc == 0) {
      g_calls++;
      return py::reinterpret_steal<py::object>(THPVariable_Wrap(y));
    }
  }
  return py::handle(g_impl[ACT_FWD])(x_obj, backend);
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
  return py::handle(g_impl[SOFTMAX_FWD])(x_obj, dim, backend);
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
  return py::handle(g_impl[LAYER_NORM_FWD])(x_obj, w_obj, b_obj, r_obj, eps_obj, backend);
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
  return py::handle(g_impl[RMS_NORM_FWD])(x_obj, w_obj, r_obj, eps_obj, backend);
}

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

// configure(...): the cpu backend's constants and the Python bodies, once at load
void configure(const std::string &best_isa, int64_t nt_min_bytes, int64_t parallel_min, int64_t softmax_scratch,
               py::object override_var, py::object silu_impl, py::object softmax_impl, py::object layer_norm_impl,
               py::object rms_norm_impl) {
  g_best_isa = best_isa;
  g_nt_min_bytes = nt_min_bytes;
  g_parallel_min = parallel_min;
  g_softmax_scratch = softmax_scratch;
  Py_XINCREF(override_var.ptr());
  g_override = override_var.ptr();
  g_impl[ACT_FWD] = silu_impl.release().ptr();
  g_impl[SOFTMAX_FWD] = softmax_impl.release().ptr();
  g_impl[LAYER_NORM_FWD] = layer_norm_impl.release().ptr();
  g_impl[RMS_NORM_FWD] = rms_norm_impl.release().ptr();
}

}  // namespace

PYBIND11_MODULE(_tsr_fastpath, m) {
  m.def("configure", &configure);
  m.def("note", &note);
  m.def("silu", &silu);
  m.def("softmax", &softmax);
  m.def("layer_norm", &layer_norm);
  m.def("rms_norm", &rms_norm);
  m.def("calls", [] { return g_calls; });
}
