// conv2d's plain eager call in C++, by learned routes (included by fastpath.cpp, inside its
// anonymous namespace: it uses that file's kernel(), launch(), g_impl, ...).
//
// Why: a batch-1 ResNet / MobileNetV2 layer takes 50-150 us in oneDNN, and the Python path of
// tessera.conv2d (argument checks, backend selection, the plan, the dispatch rule, the launch)
// cost 18-30 us on top: 0.76-0.86x F.conv2d on the 1x1 layers whatever route it took.
//
// How, without a second copy of the Python logic: the Python body stays the specification.
// Each time it runs a forward on the cpu backend (ops/conv2d/cpu.py), it tells this file what
// it did for that call's signature (learn_conv2d): the vendor call (F.conv2d's arguments and
// the in-place relu / relu6), or the kernel launch (which kernel, the packing geometry, the
// packed weight).  A later call with the same signature replays that here.  The signature is
// everything the Python decision reads: x's sizes and strides, the dtypes, weight's and bias's
// sizes, the conv's arguments, the activation and TESSERA_DISPATCH, and which weight tensor (one
// entry per layer); the backend request and TESSERA_BACKEND / use_backend() / TESSERA_CPU_ISA are
// checked as for the other ops (kernel()).
// The dispatch rule's inputs in Python (dispatch.thresholds() and the module's rule functions
// and constants) are snapshotted by identity: if any was replaced (a test's monkeypatch, a
// calibration re-read), every learned route is dropped.  A kernel route also holds the weight's
// stamp (the tensor, its version counter, data pointer and strides: _library.per_tensor's) and
// a weak reference to the packed weight that cache keeps; a stale one is a miss.  Any miss, or
// a kernel's error code, runs the Python body, which handles or rejects the call as before.

// learned conv2d routes
enum ConvRoute { CONV_VENDOR = 0, CONV_DENSE = 1, CONV_DW = 2 };
constexpr size_t CONV_KEY_LEN = 28;
using ConvKey = std::array<int64_t, CONV_KEY_LEN>;
template <size_t N>
struct KeyHash {
  size_t operator()(const std::array<int64_t, N> &k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t e : k) h = (h ^ (uint64_t)e) * 1099511628211ull;
    return (size_t)h;
  }
};
using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// which tensor a learned route read, and its state then (_library.per_tensor's stamp: the tensor,
// its version counter, data pointer and strides): still current only for that same, live,
// unchanged tensor (an address reused by a new tensor is a miss, never a stale replay)
struct Stamp {
  std::optional<WeakImpl> ref;
  const c10::TensorImpl *impl = nullptr;
  int64_t version = 0;
  const void *data = nullptr;
  std::vector<int64_t> strides;

  void take(const at::Tensor &t) {  // t must not be an inference tensor (no version counter)
    ref = WeakImpl(t.getIntrusivePtr());
    impl = t.unsafeGetTensorImpl();
    version = t._version();
    data = t.data_ptr();
    strides = t.strides().vec();
  }
  bool current(const at::Tensor &t) const {
    return !t.is_inference() && t.unsafeGetTensorImpl() == impl && ref && !ref->expired() && t._version() == version &&
           t.data_ptr() == data && t.strides().equals(strides);
  }
};

struct ConvEntry {
  int route = CONV_VENDOR, act = 0, cl = 0;
  py::object count_key;                      // dispatch.counts' key (op, route), counted per call
  int64_t s[2] = {1, 1}, p[2] = {0, 0}, d[2] = {1, 1}, groups = 1;  // vendor: F.conv2d's
  // kernel: the packed weight and the stamp of the weight it was packed from
  Stamp w;
  std::optional<WeakImpl> wp_ref;
  // kernel geometry (ops/conv2d/cpu.py's _learn documents each field)
  int64_t view = 0, Hs = 0, Ws = 0, sub_h = 1, sub_w = 1, Hd = 0, Wd = 0, off_h = 0, off_w = 0, cop = 0, K = 0,
          M = 0, KH = 0, KW = 0, ks_h = 1, ks_w = 1, kd_h = 1, kd_w = 1, vp_t = 0, vp_l = 0, OH = 0, OW = 0,
          cout = 0;
};
constexpr size_t CONV_TABLE_MAX = 4096;  // like _library.SignatureCache: cleared past this
// never destroyed: its Python references must not be released after the interpreter, at exit
// (shared entries: a call holds its own while it runs without the GIL, whatever the table does)
auto *g_conv_table = new std::unordered_map<ConvKey, std::shared_ptr<ConvEntry>, KeyHash<CONV_KEY_LEN>>();

struct ConvRules {
  PyObject *globals = nullptr;     // tessera.dispatch's module dict
  std::vector<PyObject *> names;   // the rule's attributes (interned), snapshotted by identity
  std::vector<PyObject *> seen;    // their values when the table's routes were learned (owned)
  PyObject *thresholds = nullptr;  // interned "thresholds": its result's identity is snapshotted too
  PyObject *counts = nullptr;      // interned "counts"
} g_conv;

// the rule's current values (new references; the last one is thresholds()'s result), or empty
std::vector<PyObject *> conv_rule_values() {
  std::vector<PyObject *> v;
  if (!g_conv.globals) return v;
  for (PyObject *n : g_conv.names) v.push_back(Py_XNewRef(PyDict_GetItem(g_conv.globals, n)));
  PyObject *f = PyDict_GetItem(g_conv.globals, g_conv.thresholds);
  PyObject *r = f ? PyObject_CallNoArgs(f) : nullptr;  // an lru_cache hit: the same dict each call
  if (!r) PyErr_Clear();
  v.push_back(r);
  return v;
}

void release(std::vector<PyObject *> &v) {
  for (PyObject *o : v) Py_XDECREF(o);
  v.clear();
}

// are the learned routes still the rule's?  If not, they are dropped and, with `take`, the
// current rule becomes the table's
bool conv_rules_current(bool take) {
  std::vector<PyObject *> now = conv_rule_values();
  bool same = !now.empty() && now.size() == g_conv.seen.size() && now.back() != nullptr;
  for (size_t i = 0; same && i < now.size(); i++) same = now[i] == g_conv.seen[i];
  if (!same) {
    g_conv_table->clear();
    if (take) std::swap(now, g_conv.seen);
  }
  release(now);
  return same;
}

void configure_conv2d(py::module_ dispatch, py::tuple names) {
  g_conv.globals = Py_NewRef(PyModule_GetDict(dispatch.ptr()));
  for (py::handle n : names) g_conv.names.push_back(PyUnicode_InternFromString(py::str(n).cast<std::string>().c_str()));
  g_conv.thresholds = PyUnicode_InternFromString("thresholds");
  g_conv.counts = PyUnicode_InternFromString("counts");
}

// a tensor argument the fast path takes: an exact Tensor or Parameter on the CPU
bool cpu_tensor(PyObject *o, at::Tensor &out) {
  if (!THPVariable_CheckExact(o) && !is_parameter(o)) return false;
  const at::Tensor &t = THPVariable_Unpack(o);
  if (!t.device().is_cpu()) return false;
  out = t;
  return true;
}

// n ints of a list / tuple of exact ints into dst
bool ints_of(PyObject *o, int64_t *dst, Py_ssize_t n) {
  if (!(PyList_Check(o) || PyTuple_Check(o)) || PySequence_Fast_GET_SIZE(o) != n) return false;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *e = PySequence_Fast_GET_ITEM(o, i);
    if (!PyLong_CheckExact(e)) return false;
    dst[i] = PyLong_AsLongLong(e);
    if (dst[i] == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
  }
  return true;
}

// an exact Python int into dst (a bool is a different signature)
bool int_of(PyObject *o, int64_t &dst) {
  if (!PyLong_CheckExact(o)) return false;
  dst = PyLong_AsLongLong(o);
  if (dst == -1 && PyErr_Occurred()) return PyErr_Clear(), false;
  return true;
}

// the first KEY_TENSOR_FIELDS fields of a conv twin's key: x's sizes and strides, the weight's
// sizes, x's, the weight's and the bias's dtypes and the bias's size (-1 without one)
constexpr size_t KEY_TENSOR_FIELDS = 16;
void key_tensor_fields(int64_t *k, const at::Tensor &x, const at::Tensor &w, const at::Tensor &b) {
  size_t i = 0;
  for (int j = 0; j < 4; j++) k[i++] = x.size(j);
  for (int j = 0; j < 4; j++) k[i++] = x.stride(j);
  for (int j = 0; j < 4; j++) k[i++] = w.size(j);
  k[i++] = (int64_t)x.scalar_type();
  k[i++] = (int64_t)w.scalar_type();
  k[i++] = b.defined() ? (int64_t)b.scalar_type() : -1;
  k[i++] = b.defined() ? b.size(0) : -1;
}

// ops/conv2d/cpu.py's ACT_CODE (None, relu, relu6, silu, gelu), -1 for anything else
int conv_act_code(PyObject *a) {
  if (a == Py_None) return 0;
  if (!PyUnicode_CheckExact(a)) return -1;
  static const char *names[] = {"relu", "relu6", "silu", "gelu"};
  for (int i = 0; i < 4; i++)
    if (PyUnicode_CompareWithASCIIString(a, names[i]) == 0) return i + 1;
  return -1;
}

// TESSERA_DISPATCH: 0 unset / empty, 1 auto, 2 kernel, 3 vendor; -1 invalid (Python says why)
int dispatch_mode_code() {
  const char *m = std::getenv("TESSERA_DISPATCH");
  if (!m || !*m) return 0;
  static const char *names[] = {"auto", "kernel", "vendor"};
  for (int i = 0; i < 3; i++)
    if (std::strcmp(m, names[i]) == 0) return i + 1;
  return -1;
}

// the call's tensors and signature; false for anything the table never holds
bool conv_signature(PyObject *const *a, at::Tensor &x, at::Tensor &w, at::Tensor &b, ConvKey &k, int &act) {
  if (!cpu_tensor(a[0], x) || !cpu_tensor(a[1], w) || x.dim() != 4 || w.dim() != 4) return false;
  if (a[2] != Py_None && (!cpu_tensor(a[2], b) || b.dim() != 1)) return false;
  act = conv_act_code(a[7]);
  const int mode = dispatch_mode_code();
  if (act < 0 || mode < 0) return false;
  key_tensor_fields(&k[0], x, w, b);
  size_t i = KEY_TENSOR_FIELDS;
  if (!ints_of(a[3], &k[i], 2) || !ints_of(a[4], &k[i + 2], 4) || !ints_of(a[5], &k[i + 6], 2)) return false;
  i += 8;
  if (!int_of(a[6], k[i++])) return false;
  k[i++] = act;
  k[i++] = mode;
  // the weight tensor too: a network repeats a signature in many layers (MobileNetV2: 28 of 52
  // convs), each replaying its own packed weight.  (A vendor route reads no weight state; a
  // kernel route checks its stamp, so an address reused by a new tensor is a miss, never stale.)
  k[i++] = (int64_t)(uintptr_t)w.unsafeGetTensorImpl();
  return i == CONV_KEY_LEN;
}

bool in_layout(const at::Tensor &t, int cl) {  // dispatch._in_kernel_layout
  const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
  return cl ? t.stride(0) == h * w * c && t.stride(1) == 1 && t.stride(2) == w * c && t.stride(3) == c
            : t.stride(0) == c * h * w && t.stride(1) == h * w && t.stride(2) == w && t.stride(3) == 1;
}

at::Tensor conv_out(const at::Tensor &x, int64_t n, int64_t c, int64_t h, int64_t w, int cl) {  // cpu._out
  return cl ? at::empty({n, h, w, c}, x.options()).permute({0, 3, 1, 2}) : at::empty({n, c, h, w}, x.options());
}

void count(const ConvEntry &e) {  // dispatch.counts[(op, route)] += 1, as dispatch.use_vendor does
  PyObject *counts = PyDict_GetItem(g_conv.globals, g_conv.counts);
  if (!counts || !PyDict_Check(counts)) return;
  PyObject *old = PyDict_GetItem(counts, e.count_key.ptr());
  PyObject *n = PyLong_FromLongLong((old && PyLong_Check(old) ? PyLong_AsLongLong(old) : 0) + 1);
  if (n) PyDict_SetItem(counts, e.count_key.ptr(), n);
  Py_XDECREF(n);
  PyErr_Clear();
}

// the vendor route: F.conv2d, relu / relu6 in place, returned in the kernels' layout
at::Tensor conv_vendor(const ConvEntry &e, const at::Tensor &x, const at::Tensor &w, const at::Tensor &b) {
  at::Tensor y;
  {
    py::gil_scoped_release nogil;
    y = at::conv2d(x, w, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt, {e.s[0], e.s[1]},
                   {e.p[0], e.p[1]}, {e.d[0], e.d[1]}, e.groups);
    if (e.act == 1) y.relu_();
    if (e.act == 2) y.clamp_(0.0, 6.0);
  }
  if (in_layout(y, e.cl)) return y;
  at::Tensor out = conv_out(x, y.size(0), y.size(1), y.size(2), y.size(3), e.cl);
  out.copy_(y);
  return out;
}

// the kernel route: pack x unless it is read in place, then the dense or depthwise kernel
// (the calls of cpu.py's _pack / _conv, argument for argument); undefined if it cannot run
// is w still the weight a kernel route packed (_library.per_tensor's stamp)?
bool weight_current(const ConvEntry &e, const at::Tensor &w) {
  return e.w.current(w) && e.wp_ref && !e.wp_ref->expired();
}

at::Tensor conv_kernel(const ConvEntry &e, const at::Tensor &x, const at::Tensor &w, const at::Tensor &b) {
  if (!weight_current(e, w)) return at::Tensor();
  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> wp_impl = e.wp_ref->lock();
  void *fn = kernel(e.route == CONV_DW ? CONV_FWD_DW : CONV_FWD), *pack = e.view ? nullptr : kernel(CONV_PACK);
  if (!wp_impl || !fn || (!e.view && !pack)) return at::Tensor();
  const at::Tensor wp(std::move(wp_impl));
  const at::Tensor b32 = !b.defined() || (b.scalar_type() == at::kFloat && b.is_contiguous())
                             ? b : b.to(at::kFloat).contiguous();
  const int64_t N = x.size(0), C = x.size(1);
  at::Tensor out = conv_out(x, N, e.cout, e.OH, e.OW, e.cl), xp = x;
  int64_t Hp = e.Hs, Wp = e.Ws;
  int rc = 0;
  if (!e.view) {
    Hp = e.Hd, Wp = e.Wd;
    xp = at::empty({N, Hp, Wp, C}, x.options().dtype(at::kFloat));
    using P = int (*)(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      const float *, int, float *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int);
    rc = launch(xp.numel(), [&] {
      return ((P)pack)(x.data_ptr(), dtype_code(x.scalar_type()), N, C, e.Hs, e.Ws, x.stride(0), x.stride(1),
                       x.stride(2) * e.sub_h, x.stride(3) * e.sub_w, nullptr, 0, (float *)xp.data_ptr(), Hp, Wp,
                       e.off_h, e.off_w, 1, 1, threads_for(xp.numel()));
    });
  }
  const int64_t work = N * e.OH * e.OW * e.cout * std::max<int64_t>(1, e.K) * e.KH * e.KW / 16;
  const float *bp = b32.defined() ? (const float *)b32.data_ptr() : nullptr;
  if (rc == 0 && e.route == CONV_DW) {
    using F = int (*)(const void *, int, int64_t, int64_t, int64_t, int64_t, const float *, const float *, void *,
                      int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int, int);
    rc = launch(work, [&] {
      return ((F)fn)(xp.data_ptr(), dtype_code(xp.scalar_type()), N, Hp, Wp, C, (const float *)wp.data_ptr(), bp,
                     out.data_ptr(), dtype_code(out.scalar_type()), out.stride(0), out.stride(1), out.stride(2),
                     out.stride(3), e.OH, e.OW, e.KH, e.KW, e.ks_h, e.ks_w, e.kd_h, e.kd_w, e.vp_t, e.vp_l, e.act,
                     threads_for(work));
    });
  } else if (rc == 0) {
    using F = int (*)(const float *, int64_t, int64_t, int64_t, int64_t, const float *, int64_t, const float *, void *,
                      int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int, int);
    rc = launch(work, [&] {
      return ((F)fn)((const float *)xp.data_ptr(), N, Hp, Wp, C, (const float *)wp.data_ptr(), e.cop, bp,
                     out.data_ptr(), dtype_code(out.scalar_type()), out.stride(0), out.stride(1), out.stride(2),
                     out.stride(3), e.OH, e.OW, e.groups, e.K, e.M, e.KH, e.KW, e.ks_h, e.ks_w, e.kd_h, e.kd_w,
                     e.act, threads_for(work));
    });
  }
  return rc == 0 ? out : at::Tensor();
}

// tessera.ops.conv2d._conv2d_impl's twin: a learned route, else the Python body
PyObject *conv2d(PyObject *, PyObject *const *a, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_Format(PyExc_TypeError, "conv2d: expected 9 arguments, got %zd", nargs);
    return nullptr;
  }
  at::Tensor x, w, b, y;
  ConvKey k{};
  int act = 0;
  if (is_cpu_request(a[8]) && cpu_chosen() && conv_signature(a, x, w, b, k, act) && x.size(0) > 0) {
    auto it = g_conv_table->find(k);
    if (it != g_conv_table->end() && conv_rules_current(false)) {
      const std::shared_ptr<ConvEntry> held = it->second;
      const ConvEntry &e = *held;
      try {
        y = e.route == CONV_VENDOR ? conv_vendor(e, x, w, b) : conv_kernel(e, x, w, b);
      } catch (const std::exception &) {  // the Python body redoes the call and reports it
        y = at::Tensor();
      }
      if (y.defined()) {
        count(e);
        g_calls++;
        return THPVariable_Wrap(y);
      }
      if (e.route != CONV_VENDOR) g_conv_table->erase(k);  // a stale weight: relearned by Python
    }
  }
  return PyObject_Vectorcall(g_impl[CONV2D], a, nargs, nullptr);
}

// learn_conv2d(args, count_key, route, wp, geometry): what the Python body did for this call
// (ops/conv2d/cpu.py's _learn); args are the body's 9 arguments.  True if it was recorded.
bool learn_conv2d(py::tuple args, py::object count_key, int route, py::object wp_obj, py::tuple geom) {
  if (args.size() != 9 || !g_conv.globals) return false;
  PyObject *a[9];
  for (int i = 0; i < 9; i++) a[i] = args[i].ptr();
  at::Tensor x, w, b;
  ConvKey k{};
  int act = 0;
  if (!conv_signature(a, x, w, b, k, act)) return false;
  // a training step runs the Python body (autograd) on every call: an entry that is still what it
  // would record is kept, not rebuilt
  auto it = conv_rules_current(true) ? g_conv_table->find(k) : g_conv_table->end();
  if (it != g_conv_table->end() && it->second->route == route &&
      (route == CONV_VENDOR || weight_current(*it->second, w)))
    return true;
  if (g_conv_table->size() >= CONV_TABLE_MAX) g_conv_table->clear();
  auto held = std::make_shared<ConvEntry>();
  ConvEntry &e = *held;
  e.route = route;
  e.act = act;
  e.count_key = count_key;
  e.cl = x.dim() == 4 && x.size(1) > 1 && x.stride(1) == 1 && x.stride(3) > 1;  // cpu._channels_last
  ints_of(a[3], e.s, 2);
  int64_t pads[4];
  ints_of(a[4], pads, 4);
  if (route == CONV_VENDOR && (pads[0] != pads[1] || pads[2] != pads[3])) return false;  // F.pad first: Python's
  e.p[0] = pads[0], e.p[1] = pads[2];
  ints_of(a[5], e.d, 2);
  e.groups = PyLong_AsLongLong(a[6]);
  if (route != CONV_VENDOR) {
    at::Tensor wp;
    if (!cpu_tensor(wp_obj.ptr(), wp) || w.is_inference() || geom.size() != 23) return false;
    int64_t *f[] = {&e.view, &e.Hs, &e.Ws, &e.sub_h, &e.sub_w, &e.Hd, &e.Wd, &e.off_h, &e.off_w, &e.cop, &e.K, &e.M,
                    &e.KH, &e.KW, &e.ks_h, &e.ks_w, &e.kd_h, &e.kd_w, &e.vp_t, &e.vp_l, &e.OH, &e.OW, &e.cout};
    for (size_t i = 0; i < geom.size(); i++) *f[i] = geom[i].cast<int64_t>();
    e.w.take(w);
    e.wp_ref = WeakImpl(wp.getIntrusivePtr());
  }
  (*g_conv_table)[k] = std::move(held);
  return true;
}

size_t conv2d_learned() { return g_conv_table->size(); }
