// conv2d_int8's plain eager call in C++, by learned routes (included by fastpath.cpp after
// fastpath_conv2d.h, inside its anonymous namespace: it uses kernel(), launch(), Stamp, ...).
//
// Why: a batch-1 quantized MobileNetV2 layer runs its kernel in 20-150 us, and the Python path of
// tessera.conv2d_int8 (checks, backend selection, the per-weight caches, two to four ctypes
// launches) cost ~60 us on top: ~3 ms of a ~13 ms model.
//
// How, as for conv2d (fastpath_conv2d.h): the Python body stays the specification.  Each time
// ops/_requant/cpu.py's conv_forward runs, it tells this file what it did (learn_conv2d_int8):
// the route (the GEMM, or the depthwise kernel with fp32 taps or with int32 ones), whether x was
// subsampled (a strided 1x1), made channels-last and gathered by im2col (and in which column
// order), and the two tensors derived from the weight, bias and x_zp that the kernel reads.  A
// later call with the same signature replays those launches here, argument for argument.  The
// signature is everything those decisions read: x's sizes, strides and dtype, the weight's sizes
// and dtype and which weight tensor, the bias's dtype and size, the multiplier / shift sizes, the
// zero points, the conv's arguments, qmin / qmax, the rounding and the output dtype.  A replay
// also needs the weight and the bias to be the very tensors, unchanged, that the derived tensors
// came from (their stamps), and those derived tensors alive (weak references to what
// _library.per_tensor keeps); the shift values are checked on every call against the range the
// Python check applies.  Anything else, or a kernel's error code, runs the Python body.

enum QRoute { Q_GEMM = 1, Q_DW_K3 = 2, Q_DW = 3 };  // ops/_requant/cpu.py: GEMM, DEPTHWISE_K3, DEPTHWISE
constexpr int Q_FUSED = 2;                           // its im2col flag FUSED: the GEMM makes the rows
// the key's fields (qconv_signature): x's sizes and strides, weight's sizes, the dtypes, then these
enum QKeyField { QK_X_ZP = 18, QK_OUT_ZP, QK_STRIDE, QK_PADDING = 22, QK_DILATION = 24, QK_GROUPS = 26, QK_QMIN,
                 QK_QMAX, QK_ROUNDING, QK_OUT_DTYPE, QK_WEIGHT, QCONV_KEY_LEN };
using QConvKey = std::array<int64_t, QCONV_KEY_LEN>;
static_assert(QK_OUT_ZP == 19 && QK_WEIGHT == 31, "qconv_signature's field order");

// What every learned integer launch (this file's and fastpath_linear_int8.h's) holds about the
// call it came from: the stamps of the weight and bias its derived tensors were made from, and
// the shift range the Python check applies (SHIFT_RANGE of the accumulator's path).
struct Int8Learned {
  int64_t shift_lo = 0, shift_hi = 0;
  Stamp w, b;  // b: only when the call had a bias
  bool has_bias = false;

  // false for an inference tensor (no version counter to stamp): nothing is learned then
  bool take(const at::Tensor &wt, const at::Tensor &bt, int64_t lo, int64_t hi) {
    if (wt.is_inference() || (bt.defined() && bt.is_inference())) return false;
    shift_lo = lo, shift_hi = hi;
    w.take(wt);
    has_bias = bt.defined();
    if (has_bias) b.take(bt);
    return true;
  }
  // the same weight and bias, unchanged, and scales the kernels can read: int32, contiguous, every
  // shift inside the range (requantize.check_shift_values, on every call)
  bool current(const at::Tensor &wt, const at::Tensor &bt, const at::Tensor &m, const at::Tensor &s) const {
    if (!w.current(wt) || bt.defined() != has_bias || (bt.defined() && !b.current(bt)) ||
        m.scalar_type() != at::kInt || s.scalar_type() != at::kInt || !m.is_contiguous() || !s.is_contiguous())
      return false;
    const int32_t *sp = (const int32_t *)s.data_ptr();
    for (int64_t i = 0; i < s.numel(); i++)
      if (sp[i] < shift_lo || sp[i] > shift_hi) return false;
    return true;
  }
};

// the rounding argument as the kernels' mode: 0 "double", 1 "single", -1 anything else
int64_t rounding_code(PyObject *o) {
  if (!PyUnicode_CheckExact(o)) return -1;
  if (PyUnicode_CompareWithASCIIString(o, "double") == 0) return 0;
  if (PyUnicode_CompareWithASCIIString(o, "single") == 0) return 1;
  return -1;
}

// entry k of a learned table, replayed (`replay(entry)`: the output, undefined if stale or a kernel
// failed): a new reference to the output, else nullptr -- no entry, or a stale one, erased, which
// the Python body then relearns (it also redoes a call whose replay threw, and reports it)
template <class Table, class Key, class Replay>
PyObject *replay_learned(Table &table, const Key &k, Replay replay) {
  auto it = table.find(k);
  if (it == table.end()) return nullptr;
  const auto held = it->second;  // this call's own reference, whatever the table does meanwhile
  at::Tensor y;
  try {
    y = replay(*held);
  } catch (const std::exception &) {
    y = at::Tensor();
  }
  if (y.defined()) {
    g_calls++;
    return THPVariable_Wrap(y);
  }
  table.erase(k);
  return nullptr;
}

struct QConvEntry : Int8Learned {
  int route = Q_GEMM, sub = 0, pre = 0, gather = 0, order = 0;
  int64_t Ho = 0, Wo = 0;
  std::optional<WeakImpl> held0, held1;  // (wbuf, off), (wf, init) or (wt, off)
};
auto *g_qconv_table = new std::unordered_map<QConvKey, std::shared_ptr<QConvEntry>, KeyHash<QCONV_KEY_LEN>>();

// the body's arguments: x, x_zp, weight, bias, multiplier, shift, out_zp, stride, padding, dilation,
// groups, qmin, qmax, rounding, out_dtype (, backend).  False for anything the table never holds.
bool qconv_signature(PyObject *const *a, at::Tensor &x, at::Tensor &w, at::Tensor &b, at::Tensor &m, at::Tensor &s,
                     QConvKey &k) {
  if (!cpu_tensor(a[0], x) || !cpu_tensor(a[2], w) || !cpu_tensor(a[4], m) || !cpu_tensor(a[5], s) || x.dim() != 4 ||
      w.dim() != 4 || m.dim() > 1 || s.dim() > 1)
    return false;
  if (a[3] != Py_None && (!cpu_tensor(a[3], b) || b.dim() != 1)) return false;
  const int64_t rounding = rounding_code(a[13]);
  if (!THPDtype_Check(a[14]) || rounding < 0) return false;
  key_tensor_fields(&k[0], x, w, b);
  size_t i = KEY_TENSOR_FIELDS;
  k[i++] = m.numel();
  k[i++] = s.numel();
  if (!int_of(a[1], k[i++]) || !int_of(a[6], k[i++])) return false;
  if (!ints_of(a[7], &k[i], 2) || !ints_of(a[8], &k[i + 2], 2) || !ints_of(a[9], &k[i + 4], 2)) return false;
  i += 6;
  if (!int_of(a[10], k[i++]) || !int_of(a[11], k[i++]) || !int_of(a[12], k[i++])) return false;
  k[i++] = rounding;
  k[i++] = (int64_t)((THPDtype *)a[14])->scalar_type;
  k[i++] = (int64_t)(uintptr_t)w.unsafeGetTensorImpl();  // one entry per layer (fastpath_conv2d.h)
  return i == QCONV_KEY_LEN;
}

// _requant/cpu.py's transpose_i8: dst[b][s][r] = src[b][r][s] (int8, contiguous [B][R][S] -> [B][S][R])
int transpose_i8(const at::Tensor &src, int64_t B, int64_t R, int64_t S, at::Tensor &dst) {
  void *fn = kernel(RQ_TRANSPOSE);
  using T = int (*)(const void *, int64_t, int64_t, int64_t, int64_t, int64_t, void *, int64_t, int64_t, int);
  const int64_t n = B * R * S;
  return !fn ? -1 : launch(n, [&] {
    return ((T)fn)(src.data_ptr(), B, R, S, S, R * S, dst.data_ptr(), R, R * S, threads_for(n));
  });
}

// _requant/cpu.py's _channels_last: x itself when its channels are unit-stride, else a copy
at::Tensor qconv_channels_last(const at::Tensor &x, int &rc) {
  if (x.stride(1) == 1 || x.size(1) <= 1) return x;
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  at::Tensor xc = at::empty({N, H, W, C}, x.options());
  if (x.scalar_type() == at::kChar && x.is_contiguous()) {
    rc = transpose_i8(x, N, C, H * W, xc);
  } else {
    xc.copy_(x.permute({0, 2, 3, 1}));
  }
  return xc.permute({0, 3, 1, 2});
}

// the learned launches (conv_forward's, argument for argument) into rows [N*Ho*Wo, O]; 0 if done
int qconv_rows(const QConvEntry &e, const QConvKey &k, at::Tensor x, const at::Tensor &w, const at::Tensor &m,
               const at::Tensor &s, const at::Tensor &h0, const at::Tensor &h1, at::Tensor &out) {
  const int64_t Ho = e.Ho, Wo = e.Wo;
  const int64_t *st = &k[QK_STRIDE], *pd = &k[QK_PADDING], *dl = &k[QK_DILATION], x_zp = k[QK_X_ZP],
                o_zp = k[QK_OUT_ZP], groups = k[QK_GROUPS], qmin = k[QK_QMIN], qmax = k[QK_QMAX],
                rounding = k[QK_ROUNDING];
  int64_t stride[2] = {st[0], st[1]};
  const int64_t O = w.size(0), Cg = w.size(1), kh = w.size(2), kw = w.size(3), cs = m.numel() > 1;
  const int out16 = out.scalar_type() == at::kShort;
  int rc = 0;
  if (e.sub) {
    x = x.slice(2, 0, x.size(2), stride[0]).slice(3, 0, x.size(3), stride[1]);
    stride[0] = stride[1] = 1;
  }
  if (e.pre) x = qconv_channels_last(x, rc);
  if (rc) return rc;
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int32_t *mp = (const int32_t *)m.data_ptr(), *sp = (const int32_t *)s.data_ptr();
  if (e.route == Q_DW_K3) {
    void *fn = kernel(RQ_DW_K3);
    using F = int (*)(const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const float *,
                      const float *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      const int32_t *, const int32_t *, int64_t, int64_t, int64_t, int64_t, int, void *, int64_t, int,
                      int);
    const int64_t work = out.numel() * kh * 3;
    return !fn ? -1 : launch(work, [&] {
      return ((F)fn)(x.data_ptr(), N, C, H, W, x.stride(0), x.stride(2), x.stride(3), (const float *)h0.data_ptr(),
                     (const float *)h1.data_ptr(), kh, stride[0], stride[1], pd[0], pd[1], dl[0], Ho, Wo, x_zp, mp,
                     sp, cs, o_zp, qmin, qmax, (int)rounding, out.data_ptr(), out.stride(0), out16, threads_for(work));
    });
  }
  if (e.route == Q_DW) {
    void *fn = kernel(RQ_DW);
    using F = int (*)(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      const int32_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, const int32_t *, const int32_t *, int64_t, const int64_t *, int64_t, int64_t,
                      int64_t, int, void *, int64_t, int, int);
    const int64_t work = out.numel() * kh * kw;
    return !fn ? -1 : launch(work, [&] {
      return ((F)fn)(x.data_ptr(), (int)x.element_size(), N, C, H, W, x.stride(0), x.stride(1), x.stride(2),
                     x.stride(3), (const int32_t *)h0.data_ptr(), kh, kw, stride[0], stride[1], pd[0], pd[1], dl[0],
                     dl[1], Ho, Wo, x_zp, mp, sp, cs, (const int64_t *)h1.data_ptr(), o_zp, qmin, qmax, (int)rounding,
                     out.data_ptr(), out.stride(0), out16, threads_for(work));
    });
  }
  const int vnni = vnni_ok(), bits = x.scalar_type() == at::kChar ? 8 : 16;
  const int64_t M = N * Ho * Wo, Og = O / groups, Kg = Cg * kh * kw, es = x.element_size();
  // h0: _requant/cpu.py's _gemm_weight buffer, w2 [O, Kg] then (64-byte aligned) its packed panels
  const int8_t *w2 = (const int8_t *)h0.data_ptr();
  const int64_t head = (O * Kg + 63) / 64 * 64;
  const int8_t *packed = groups == 1 && h0.numel() > head ? w2 + head : nullptr;
  const int64_t *off = (const int64_t *)h1.data_ptr();
  if (e.gather == Q_FUSED) {  // _qlinear_int8/cpu.py conv_requant: the GEMM makes the im2col rows
    void *fn = kernel(RQ_CONV);
    using F = int (*)(const void *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const int8_t *,
                      int64_t, const int32_t *, const int32_t *, int64_t, const int64_t *, int64_t, int64_t, int64_t,
                      int, void *, int64_t, int, int, const int8_t *);
    const int64_t work = std::max<int64_t>(M, 16) * O * Kg / 16;
    return !fn ? -1 : launch(M * O * Kg, [&] {
      return ((F)fn)(x.data_ptr(), N, C, H, W, x.stride(0), x.stride(2), x.stride(3), kh, kw, stride[0], stride[1],
                     pd[0], pd[1], dl[0], dl[1], Ho, Wo, x_zp, w2, O, mp, sp, cs, off, o_zp, qmin, qmax, (int)rounding,
                     out.data_ptr(), out.stride(0), vnni, threads_for(work), packed);
    });
  }
  // the GEMM: x's rows as the columns (a pointwise conv of channels-last x), or im2col's
  const void *cols = x.data_ptr();
  int64_t Kc = C;
  at::Tensor gathered;
  if (e.gather) {
    void *fn = kernel(RQ_IM2COL);
    Kc = C * kh * kw;
    gathered = at::empty({N * Ho * Wo, Kc}, x.options());
    using G = int (*)(const void *, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                      int64_t, int64_t, int, void *, int);
    rc = !fn ? -1 : launch(gathered.numel(), [&] {
      return ((G)fn)(x.data_ptr(), (int)x.element_size(), N, C, H, W, x.stride(0), x.stride(1), x.stride(2),
                     x.stride(3), kh, kw, stride[0], stride[1], pd[0], pd[1], dl[0], dl[1], Ho, Wo, x_zp, groups,
                     e.order, gathered.data_ptr(), threads_for(gathered.numel()));
    });
    if (rc) return rc;
    cols = gathered.data_ptr();
  }
  void *fn = kernel(RQ_MM);
  if (!fn) return -1;
  using F = int (*)(const void *, int64_t, int, int64_t, int64_t, const int8_t *, int64_t, const int32_t *,
                    const int32_t *, int64_t, const int64_t *, int64_t, int64_t, int64_t, int, void *, int64_t, int,
                    int, int, const int8_t *);
  for (int64_t g = 0; g < groups && rc == 0; g++) {  // (int_mm_requant per group: cols' and w2's slices)
    const int64_t o0 = g * Og, work = std::max<int64_t>(M, 16) * Og * Kg / 16, pc = cs ? o0 : 0;
    rc = launch(M * Og * Kg, [&] {
      return ((F)fn)((const char *)cols + g * Kg * es, Kc, bits, M, Kg, w2 + o0 * Kg, Og, mp + pc, sp + pc,
                     cs && Og > 1, off + o0, o_zp, qmin, qmax, (int)rounding, (char *)out.data_ptr() + o0 * (1 + out16),
                     out.stride(0), out16, vnni, threads_for(work), packed);
    });
  }
  return rc;
}

// the call, replayed: undefined if the entry is stale (or a kernel failed)
at::Tensor qconv_replay(const QConvEntry &e, const QConvKey &k, const at::Tensor &x, const at::Tensor &w,
                        const at::Tensor &b, const at::Tensor &m, const at::Tensor &s) {
  if (!e.current(w, b, m, s) || !e.held0 || e.held0->expired() || !e.held1 || e.held1->expired())
    return at::Tensor();
  c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> i0 = e.held0->lock(), i1 = e.held1->lock();
  if (!i0 || !i1) return at::Tensor();
  const at::Tensor h0(std::move(i0)), h1(std::move(i1));
  const int64_t N = x.size(0), O = w.size(0);
  at::Tensor rows = at::empty({N * e.Ho * e.Wo, O}, x.options().dtype((at::ScalarType)k[QK_OUT_DTYPE]));
  if (qconv_rows(e, k, x, w, m, s, h0, h1, rows) != 0) return at::Tensor();
  at::Tensor y = rows.view({N, e.Ho, e.Wo, O}).permute({0, 3, 1, 2});
  if (x.is_contiguous(at::MemoryFormat::ChannelsLast) && !x.is_contiguous()) return y;
  // conv2d_int8._impl: an NCHW x gets a contiguous NCHW output (the backend's rows_to_nchw)
  at::Tensor out = at::empty({N, O, e.Ho, e.Wo}, rows.options());
  if (rows.scalar_type() != at::kChar) return out.copy_(y);
  return transpose_i8(rows, N, e.Ho * e.Wo, O, out) == 0 ? out : at::Tensor();
}

// tessera.ops.conv2d_int8._impl's twin: a learned route, else the Python body
PyObject *conv2d_int8(PyObject *, PyObject *const *a, Py_ssize_t nargs) {
  if (nargs != 16) {
    PyErr_Format(PyExc_TypeError, "conv2d_int8: expected 16 arguments, got %zd", nargs);
    return nullptr;
  }
  at::Tensor x, w, b, m, s;
  QConvKey k{};
  if (is_cpu_request(a[15]) && cpu_chosen() && qconv_signature(a, x, w, b, m, s, k) && x.size(0) > 0) {
    PyObject *y =
        replay_learned(*g_qconv_table, k, [&](const QConvEntry &e) { return qconv_replay(e, k, x, w, b, m, s); });
    if (y) return y;
  }
  return PyObject_Vectorcall(g_impl[CONV2D_INT8], a, nargs, nullptr);
}

// learn_conv2d_int8(args, route, flags, held0, held1): what conv_forward did for this call
// (ops/_requant/cpu.py's _learn documents each); args are its 15 arguments.  True if recorded.
bool learn_conv2d_int8(py::tuple args, int route, py::tuple flags, py::object held0, py::object held1) {
  if (args.size() != 15 || flags.size() != 8 || route < Q_GEMM || route > Q_DW) return false;
  PyObject *a[15];
  for (int i = 0; i < 15; i++) a[i] = args[i].ptr();
  at::Tensor x, w, b, m, s, h0, h1;
  QConvKey k{};
  if (!qconv_signature(a, x, w, b, m, s, k) || !cpu_tensor(held0.ptr(), h0) || !cpu_tensor(held1.ptr(), h1))
    return false;
  int64_t f[8];
  for (int i = 0; i < 8; i++) f[i] = flags[i].cast<int64_t>();
  auto held = std::make_shared<QConvEntry>();
  QConvEntry &e = *held;
  if (!e.take(w, b, f[6], f[7])) return false;
  if (g_qconv_table->size() >= CONV_TABLE_MAX) g_qconv_table->clear();
  e.route = route;
  e.sub = (int)f[0], e.pre = (int)f[1], e.gather = (int)f[2], e.order = (int)f[3];
  e.Ho = f[4], e.Wo = f[5];
  e.held0 = WeakImpl(h0.getIntrusivePtr());
  e.held1 = WeakImpl(h1.getIntrusivePtr());
  (*g_qconv_table)[k] = std::move(held);
  return true;
}

size_t conv2d_int8_learned() { return g_qconv_table->size(); }
