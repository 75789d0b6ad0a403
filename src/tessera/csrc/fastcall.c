/* _tsr_fastcall: a cheaper way for Python to call the cpu backend's C kernels.
 *
 * Why: a tiny eager op's cost is mostly Python-side glue, and the largest single
 * item was ctypes itself: with argtypes set it converts every argument through a
 * Python-level from_param object, ~0.19 us per argument (a 9-argument launch took
 * ~1.9 us, for a kernel that runs in ~0.05 us on 8 floats).  This module wraps one
 * C function pointer and its argument spec (the same "p/l/i/f" string the launchers
 * give cpu.declare) in a callable that converts each argument with one C-API call
 * and calls through libffi (the library ctypes itself calls through, so the call
 * is ABI-identical), ~0.3 us for the same launch.
 *
 * Semantics follow the ctypes function it replaces: the GIL is released around the
 * kernel, the result is the C int the kernel returns.  Anything this fast path does
 * not convert itself (a ctypes object, an int that does not fit, a float where an
 * int is expected) is not guessed at: the call is handed, unchanged, to the ctypes
 * function given as `fallback`, so every corner keeps ctypes' exact behaviour.
 *
 * Also getenv(name): the C environment, which os.environ writes through (putenv /
 * unsetenv), read without os.environ's Mapping machinery (an unset variable there
 * raises and catches a KeyError, ~0.8 us; here ~0.05 us).
 *
 * Glue, not a kernel: includes Python.h and ffi.h only (no torch headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ffi.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_ARGS 32

typedef union {
    void *p;
    int64_t l;
    int i;
    float f;
} arg_slot;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void (*fn)(void);
    ffi_cif cif;
    ffi_type *types[MAX_ARGS];
    char kinds[MAX_ARGS];
    Py_ssize_t nargs;
    PyObject *fallback; /* the ctypes function with the same argtypes: the slow, exact path */
} FastFn;

static PyTypeObject FastFnType;

/* Convert one argument into its slot; 0 on success, -1 when the fast path does not
 * handle it (no Python error left set: the caller hands the call to ctypes). */
static int convert(char kind, PyObject *o, arg_slot *s)
{
    int overflow = 0;
    switch (kind) {
    case 'p':
        if (o == Py_None) {
            s->p = NULL;
            return 0;
        }
        if (!PyLong_CheckExact(o))
            return -1;
        s->p = PyLong_AsVoidPtr(o);
        break;
    case 'l': {
        if (!PyLong_Check(o))
            return -1;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow)
            return -1;
        s->l = (int64_t)v;
        break;
    }
    case 'i': {
        if (!PyLong_Check(o))
            return -1;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || v < INT32_MIN || v > INT32_MAX)
            return -1;
        s->i = (int)v;
        break;
    }
    case 'f':
        if (!PyFloat_CheckExact(o) && !PyLong_CheckExact(o))
            return -1;
        s->f = (float)PyFloat_AsDouble(o);
        break;
    default:
        return -1;
    }
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static PyObject *fastfn_vectorcall(PyObject *self_obj, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    FastFn *self = (FastFn *)self_obj;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || n != self->nargs)
        return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
    arg_slot slots[MAX_ARGS];
    void *values[MAX_ARGS];
    for (Py_ssize_t k = 0; k < n; k++) {
        if (convert(self->kinds[k], args[k], &slots[k]) < 0)
            return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
        values[k] = &slots[k];
    }
    ffi_arg rc = 0;
    Py_BEGIN_ALLOW_THREADS
    ffi_call(&self->cif, self->fn, &rc, values);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong((long)(int)rc);
}

static void fastfn_dealloc(FastFn *self)
{
    Py_XDECREF(self->fallback);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fastfn_repr(FastFn *self)
{
    return PyUnicode_FromFormat("<tessera fastcall of %R>", self->fallback);
}

static PyTypeObject FastFnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tsr_fastcall.FastFn",
    .tp_basicsize = sizeof(FastFn),
    .tp_dealloc = (destructor)fastfn_dealloc,
    .tp_repr = (reprfunc)fastfn_repr,
    .tp_vectorcall_offset = offsetof(FastFn, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A C function called through libffi with the argument spec it was made with.",
};

/* wrap(address, spec, fallback) -> FastFn; spec letters: p=pointer, l=int64, i=int32, f=float;
 * the function returns a C int. */
static PyObject *wrap(PyObject *mod, PyObject *args)
{
    unsigned long long address;
    const char *spec;
    PyObject *fallback;
    if (!PyArg_ParseTuple(args, "KsO:wrap", &address, &spec, &fallback))
        return NULL;
    Py_ssize_t n = (Py_ssize_t)strlen(spec);
    if (n > MAX_ARGS) {
        PyErr_Format(PyExc_ValueError, "fastcall: %zd arguments, at most %d", n, MAX_ARGS);
        return NULL;
    }
    if (address == 0 || !PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_ValueError, "fastcall: need a function address and a callable fallback");
        return NULL;
    }
    FastFn *self = PyObject_New(FastFn, &FastFnType);
    if (self == NULL)
        return NULL;
    self->vectorcall = fastfn_vectorcall;
    self->fn = (void (*)(void))(uintptr_t)address;
    self->nargs = n;
    Py_INCREF(fallback);
    self->fallback = fallback;
    for (Py_ssize_t k = 0; k < n; k++) {
        char c = spec[k];
        self->kinds[k] = c;
        switch (c) {
        case 'p': self->types[k] = &ffi_type_pointer; break;
        case 'l': self->types[k] = &ffi_type_sint64; break;
        case 'i': self->types[k] = &ffi_type_sint32; break;
        case 'f': self->types[k] = &ffi_type_float; break;
        default:
            Py_DECREF(self);
            PyErr_Format(PyExc_ValueError, "fastcall: unknown argument kind %c in spec %s", c, spec);
            return NULL;
        }
    }
    if (ffi_prep_cif(&self->cif, FFI_DEFAULT_ABI, (unsigned)n, &ffi_type_sint32, self->types) != FFI_OK) {
        Py_DECREF(self);
        PyErr_Format(PyExc_RuntimeError, "fastcall: ffi_prep_cif failed for spec %s", spec);
        return NULL;
    }
    return (PyObject *)self;
}

/* getenv(name, default) -> str: the C environment's value, or default when unset. */
static PyObject *py_getenv(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "getenv(name: str, default)");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (name == NULL)
        return NULL;
    const char *v = getenv(name);
    if (v == NULL) {
        Py_INCREF(args[1]);
        return args[1];
    }
    /* decoded as os.environ decodes it */
    return PyUnicode_DecodeFSDefault(v);
}

static PyMethodDef methods[] = {
    {"wrap", wrap, METH_VARARGS, "wrap(address, spec, fallback) -> a fast callable"},
    {"getenv", (PyCFunction)(void (*)(void))py_getenv, METH_FASTCALL, "getenv(name, default) -> str"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tsr_fastcall", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tsr_fastcall(void)
{
    if (PyType_Ready(&FastFnType) < 0)
        return NULL;
    return PyModule_Create(&moddef);
}
