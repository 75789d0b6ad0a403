// linear_int8_requant's plain eager call in C++, by learned launches (included by fastpath.cpp after
// fastpath_conv2d_int8.h, inside its anonymous namespace: it uses kernel(), launch(), Stamp, ...).
//
// Why: the integer FC layer's kernel takes ~2-5 us at decode sizes (M = 1, a few hundred
// channels), and the Python path of tessera.linear_int8_requant (checks, backend selection, the
// per-weight caches, the ctypes launch) cost ~55 us on top.
//
// How, as for conv2d_int8 (fastpath_conv2d_int8.h): the Python body stays the specification.
// Each time ops/_requant/cpu.py's linear_forward launches the GEMM, it tells this file which
// derived tensors it read (learn_linear_int8_requant): the int64 offset (bias - x_zp sum w) and
// the packed weight panels (only for M > 16: the GEMV packs nothing).  A later call with the
// same signature replays that one launch here.  The signature is everything the launch's
// arguments depend on but x's rows: x's dtype and K, whether M > 16, the weight's sizes and
// which weight tensor, the bias's dtype and size, the multiplier / shift sizes, both zero
// points, qmin / qmax, the rounding and the output dtype.  A replay also needs x contiguous and
// non-empty, the weight and bias to be the very tensors, unchanged, that the offset came from
// (their stamps), the derived tensors alive, int32 contiguous scales and every shift value
// inside the range the Python check applies.  Anything else, or a kernel's error code, runs the
// Python body, which handles or rejects the call as before.

enum LKeyField { LK_X_DTYPE, LK_K, LK_BIG_M, LK_N, LK_W_DTYPE, LK_B_DTYPE, LK_B_SIZE, LK_M_NUMEL, LK_S_NUMEL, LK_X_ZP,
                 LK_OUT_ZP, LK_QMIN, LK_QMAX, LK_ROUNDING, LK_OUT_DTYPE, LK_WEIGHT, LINEAR_KEY_LEN };
using LinearKey = std::array<int64_t, LINEAR_KEY_LEN>;
constexpr int64_t LINEAR_GEMV_MAX_M = 16;  // _requant/cpu.py linear_forward: packed panels only above

struct LinearEntry : Int8Learned {  // (fastpath_conv2d_int8.h)
  std::optional<WeakImpl> off, packed;  // packed: absent where the launch read none
};
auto *g_linear_table = new std::unordered_map<LinearKey, std::shared_ptr<LinearEntry>, KeyHash<LINEAR_KEY_LEN>>();

// the body's arguments: x, x_zp, weight, bias, multiplier, shift, out_zp, qmin, qmax, rounding,
// out_dtype (, backend).  False for anything the table never holds.
bool linear_signature(PyObject *const *a, at::Tensor &x, at::Tensor &w, at::Tensor &b, at::Tensor &m, at::Tensor &s,
                      LinearKey &k) {
  if (!cpu_tensor(a[0], x) || !cpu_tensor(a[2], w) || !cpu_tensor(a[4], m) || !cpu_tensor(a[5], s) || x.dim() < 1 ||
      w.dim() != 2 || m.dim() > 1 || s.dim() > 1)
    return false;
  if (a[3] != Py_None && (!cpu_tensor(a[3], b) || b.dim() != 1)) return false;
  const int64_t rounding = rounding_code(a[9]);
  if (!THPDtype_Check(a[10]) || rounding < 0) return false;
  const int64_t K = x.size(-1), M = K ? x.numel() / K : 0;
  k[LK_X_DTYPE] = (int64_t)x.scalar_type();
  k[LK_K] = K;
  k[LK_BIG_M] = M > LINEAR_GEMV_MAX_M;
  k[LK_N] = w.size(0) * (int64_t(1) << 32) + w.size(1);
  k[LK_W_DTYPE] = (int64_t)w.scalar_type();
  k[LK_B_DTYPE] = b.defined() ? (int64_t)b.scalar_type() : -1;
  k[LK_B_SIZE] = b.defined() ? b.size(0) : -1;
  k[LK_M_NUMEL] = m.numel();
  k[LK_S_NUMEL] = s.numel();
  if (!int_of(a[1], k[LK_X_ZP]) || !int_of(a[6], k[LK_OUT_ZP]) || !int_of(a[7], k[LK_QMIN]) ||
      !int_of(a[8], k[LK_QMAX]))
    return false;
  k[LK_ROUNDING] = rounding;
  k[LK_OUT_DTYPE] = (int64_t)((THPDtype *)a[10])->scalar_type;
  k[LK_WEIGHT] = (int64_t)(uintptr_t)w.unsafeGetTensorImpl();  // one entry per layer
  return true;
}

// the learned launch (linear_forward's int_mm_requant, argument for argument); undefined if stale
at::Tensor linear_replay(const LinearEntry &e, const LinearKey &k, const at::Tensor &x, const at::Tensor &w,
                         const at::Tensor &b, const at::Tensor &m, const at::Tensor &s) {
  if (!e.current(w, b, m, s) || !e.off || e.off->expired() || (e.packed && e.packed->expired())) return at::Tensor();
  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> io = e.off->lock(), ip;
  if (e.packed) ip = e.packed->lock();
  if (!io || (e.packed && !ip)) return at::Tensor();
  const at::Tensor off(std::move(io)), packed = e.packed ? at::Tensor(std::move(ip)) : at::Tensor();
  void *fn = kernel(RQ_MM);
  if (!fn) return at::Tensor();
  const int64_t K = k[LK_K], M = x.numel() / K, N = w.size(0);
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  at::Tensor y = at::empty(sizes, x.options().dtype((at::ScalarType)k[LK_OUT_DTYPE]));
  using F = int (*)(const void *, int64_t, int, int64_t, int64_t, const int8_t *, int64_t, const int32_t *,
                    const int32_t *, int64_t, const int64_t *, int64_t, int64_t, int64_t, int, void *, int64_t, int,
                    int, int, const int8_t *);
  const int bits = x.scalar_type() == at::kChar ? 8 : 16, out16 = y.scalar_type() == at::kShort;
  const int vnni = vnni_ok();
  const int64_t work = std::max<int64_t>(M, 16) * N * K / 16;
  const int rc = launch(M * N * K, [&] {
    return ((F)fn)(x.data_ptr(), K, bits, M, K, (const int8_t *)w.data_ptr(), N, (const int32_t *)m.data_ptr(),
                   (const int32_t *)s.data_ptr(),
                   m.numel() > 1, (const int64_t *)off.data_ptr(), k[LK_OUT_ZP], k[LK_QMIN], k[LK_QMAX],
                   (int)k[LK_ROUNDING], y.data_ptr(), N, out16, vnni, threads_for(work),
                   packed.defined() ? (const int8_t *)packed.data_ptr() : nullptr);
  });
  return rc == 0 ? y : at::Tensor();
}

// tessera.ops.linear_int8_requant._impl's twin: a learned launch, else the Python body
PyObject *linear_int8_requant(PyObject *, PyObject *const *a, Py_ssize_t nargs) {
  if (nargs != 12) {
    PyErr_Format(PyExc_TypeError, "linear_int8_requant: expected 12 arguments, got %zd", nargs);
    return nullptr;
  }
  at::Tensor x, w, b, m, s;
  LinearKey k{};
  // (a non-contiguous or empty x is not covered: the Python body copies it or returns early)
  if (is_cpu_request(a[11]) && cpu_chosen() && linear_signature(a, x, w, b, m, s, k) && x.is_contiguous() &&
      x.numel() > 0) {
    PyObject *y =
        replay_learned(*g_linear_table, k, [&](const LinearEntry &e) { return linear_replay(e, k, x, w, b, m, s); });
    if (y) return y;
  }
  return PyObject_Vectorcall(g_impl[LINEAR_I8RQ], a, nargs, nullptr);
}

// learn_linear_int8_requant(args, shift_lo, shift_hi, off, packed): what linear_forward launched
// for this call (args: its 11 arguments; packed None where it read none).  True if recorded.
bool learn_linear_int8_requant(py::tuple args, int64_t shift_lo, int64_t shift_hi, py::object off, py::object packed) {
  if (args.size() != 11) return false;
  PyObject *a[11];
  for (int i = 0; i < 11; i++) a[i] = args[i].ptr();
  at::Tensor x, w, b, m, s, o, p;
  LinearKey k{};
  if (!linear_signature(a, x, w, b, m, s, k) || !cpu_tensor(off.ptr(), o) ||
      (!packed.is_none() && !cpu_tensor(packed.ptr(), p)))
    return false;
  auto held = std::make_shared<LinearEntry>();
  LinearEntry &e = *held;
  if (!e.take(w, b, shift_lo, shift_hi)) return false;
  if (g_linear_table->size() >= CONV_TABLE_MAX) g_linear_table->clear();
  e.off = WeakImpl(o.getIntrusivePtr());
  if (p.defined()) e.packed = WeakImpl(p.getIntrusivePtr());
  (*g_linear_table)[k] = std::move(held);
  return true;
}

size_t linear_int8_requant_learned() { return g_linear_table->size(); }
