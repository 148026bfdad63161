"""The C launcher: a piece's per-call path from Python into a kernel and back, in one C call.

``Variant.torch_launcher`` binds, once per shape, everything a call of a compiled kernel on torch tensors
needs; what is left per call is: allocate the outputs (``torch.empty``), collect the data pointers of inputs
and outputs, read the thread count, take the variant's lock and call the entry. In Python that is a pointer
array built through ctypes, a ctypes call converting three arguments, two list comprehensions and an
environment lookup: measured 4.5-10 µs on a 2-core EPYC, several times the kernel of a small program
(docs/frontend.md, "Per-call cost"). This module is that path as a CPython extension type, written here
because no library offers it (ctypes and cffi both convert arguments per call; torch's C++ extensions
would need the PyTorch headers and a C++ build of tens of seconds):

- ``Launcher(entry, max_threads, empty, default_dtype, out_args, out_kw, out_dtypes, num_threads,
  ws_floats, scratch_floats)``: ``entry`` the address of ``prism_entry``, ``empty`` the allocator
  (``torch.empty``), per output the positional arguments of its ``empty`` call, the keyword arguments
  naming its dtype (left out where the dtype is ``default_dtype()`` at the call) and the dtype;
- ``launcher(ins)``: ``ins`` a list of tensors (contiguous CPU tensors of the kernel's input dtypes, checked
  by the caller); returns the list of fresh outputs.

Two more types use it: ``Piece(arg_index, dtypes, tensor_type, grad_enabled, compiled, counter)``, a
``PieceRunner``'s checks (tensor, dtype, CPU, contiguous, no autograd) and shape lookup before the launch,
answering None for anything it does not handle (the runner's Python path then decides, with its
messages); and ``Guard(specs, tensor_type)``, ``capture="export"``'s input check (prism/frontend/direct.py).

The thread count is ``PRISM_NUM_THREADS`` read with ``getenv`` on every call (``os.environ`` writes through
``putenv``); a value that is not a plain positive integer is handed to :func:`prism.runtime.kernel.
num_threads`, which raises the usual error. A launcher owns a workspace (64-byte aligned, grown under its
lock, NaN-filled when ``PRISM_POISON_WS=1`` as the Python path's) and a lock, or uses another's (``owner``,
the last argument): ``Variant.torch_launcher`` makes every launcher of the process use the first one's
(``kernel.ARENA``), so kernels run one at a time, with the GIL released while one runs, and one workspace,
grown to the largest need, serves them all. ``launcher.workspace``: (floats allocated, the owner or None).

It is compiled on first use with the C compiler and the Python headers, into the compile cache
(``<cache>/ext/``). Where it cannot be built (no ``Python.h``, a compiler error) or with
``PRISM_C_LAUNCHER=0``, :func:`extension` returns None, ``WHY_NOT`` and the ``prism`` log (debug level) say
why, and kernels use the Python path: the same kernels, the same results, ~5 µs more per piece call.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prism.runtime import cache

LOG = logging.getLogger("prism")
MODULE = "_prism_fastcall"

SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <errno.h>
#include <time.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef int (*prism_entry_t)(void**, float*, int);

typedef struct {
    PyObject_HEAD
    prism_entry_t fn;
    int max_threads;
    Py_ssize_t nout;
    PyObject* empty;      /* the allocator, torch.empty */
    PyObject* default_dtype;  /* torch.get_default_dtype: empty() without a dtype where they agree (~1 µs) */
    PyObject* out_args;   /* tuple: per output, the positional arguments of its empty() call (a tuple) */
    PyObject* out_kw;     /* tuple: per output, the keyword arguments naming its dtype (a dict) */
    PyObject* out_dtypes; /* tuple: per output, its dtype */
    PyObject* threads;    /* prism.runtime.kernel.num_threads: the unusual PRISM_NUM_THREADS values */
    long ws_floats, scratch_floats;
    Py_ssize_t nwords;    /* a template's runtime dims, passed after the io pointers (codegen/template.py) */
    void* words[8];
    PyObject* owner;      /* a Launcher whose workspace and lock this one uses (a template's variants), or NULL */
    float* ws;            /* owned, 64-byte aligned */
    long ws_cap;          /* floats allocated */
    PyThread_type_lock lock;
} Launcher;

static PyObject* str_data_ptr;

/* Opt-in time accounting (set_profiling): seconds inside kernel entries and inside the pieces' checked fast
   path (checks, allocation, launch and kernel), and their counts; updated with the GIL held. Off: one
   branch per call. */
static int prof_on = 0;
static double prof_kernel_s = 0.0, prof_piece_s = 0.0;
static long long prof_kernel_n = 0, prof_piece_n = 0;

static double prof_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void Launcher_dealloc(Launcher* self) {
    Py_XDECREF(self->empty);
    Py_XDECREF(self->default_dtype);
    Py_XDECREF(self->out_dtypes);
    Py_XDECREF(self->out_args);
    Py_XDECREF(self->out_kw);
    Py_XDECREF(self->threads);
    Py_XDECREF(self->owner);
    free(self->ws);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static int Launcher_init(Launcher* self, PyObject* args, PyObject* kw) {
    unsigned long long entry;
    PyObject *empty, *default_dtype, *out_args, *out_kw, *out_dtypes, *threads, *words = NULL, *owner = NULL;
    if (!PyArg_ParseTuple(args, "KiOOO!O!O!Oll|O!O", &entry, &self->max_threads, &empty, &default_dtype,
                          &PyTuple_Type, &out_args, &PyTuple_Type, &out_kw, &PyTuple_Type, &out_dtypes, &threads,
                          &self->ws_floats, &self->scratch_floats, &PyTuple_Type, &words, &owner))
        return -1;
    if (owner == Py_None) owner = NULL;
    if (owner != NULL && (Py_TYPE(owner) != Py_TYPE(self) || ((Launcher*)owner)->owner != NULL)) {
        PyErr_SetString(PyExc_TypeError, "Launcher: the owner must be a Launcher that owns its workspace");
        return -1;
    }
    Py_XINCREF(owner);
    Py_XSETREF(self->owner, owner);
    self->nwords = words == NULL ? 0 : PyTuple_GET_SIZE(words);
    if (self->nwords > 8) {
        PyErr_SetString(PyExc_ValueError, "Launcher: at most 8 runtime dims");
        return -1;
    }
    for (Py_ssize_t j = 0; j < self->nwords; j++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(words, j));
        if (v == -1 && PyErr_Occurred()) return -1;
        self->words[j] = (void*)(intptr_t)v;
    }
    if (PyTuple_GET_SIZE(out_args) != PyTuple_GET_SIZE(out_kw)
            || PyTuple_GET_SIZE(out_args) != PyTuple_GET_SIZE(out_dtypes)) {
        PyErr_SetString(PyExc_ValueError, "Launcher: out_args, out_kw and out_dtypes differ in length");
        return -1;
    }
    self->fn = (prism_entry_t)(uintptr_t)entry;
    self->nout = PyTuple_GET_SIZE(out_args);
    Py_INCREF(empty); Py_XSETREF(self->empty, empty);
    Py_INCREF(default_dtype); Py_XSETREF(self->default_dtype, default_dtype);
    Py_INCREF(out_dtypes); Py_XSETREF(self->out_dtypes, out_dtypes);
    Py_INCREF(out_args); Py_XSETREF(self->out_args, out_args);
    Py_INCREF(out_kw); Py_XSETREF(self->out_kw, out_kw);
    Py_INCREF(threads); Py_XSETREF(self->threads, threads);
    if (!self->lock) self->lock = PyThread_allocate_lock();
    if (!self->lock) { PyErr_NoMemory(); return -1; }
    return 0;
}

/* PRISM_NUM_THREADS: unset or empty -> max_threads; a plain positive integer -> it; anything else -> the
   Python rule (which raises for invalid values). -1 with an exception set on error. */
static int thread_count(Launcher* self) {
    const char* e = getenv("PRISM_NUM_THREADS");
    if (e == NULL || *e == '\0') return self->max_threads;
    if (*e >= '1' && *e <= '9') {
        char* end;
        errno = 0;
        long v = strtol(e, &end, 10);
        if (*end == '\0' && errno == 0 && v >= 1 && v <= 1 << 20) return (int)v;
    }
    PyObject* r = PyObject_CallFunction(self->threads, "i", self->max_threads);
    if (r == NULL) return -1;
    long v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) return -1;
    return (int)v;
}

static int grow_workspace(Launcher* self, long need) {
    /* called with the lock held */
    if (need <= self->ws_cap) return 0;
    size_t bytes = ((size_t)need * sizeof(float) + 63) & ~(size_t)63;
    float* p = aligned_alloc(64, bytes);
    if (p == NULL) return -1;
    const char* poison = getenv("PRISM_POISON_WS");
    if (poison && strcmp(poison, "1") == 0)
        for (long i = 0; i < need; i++) p[i] = NAN;
    free(self->ws);
    self->ws = p;
    self->ws_cap = need;
    return 0;
}

/* the one positional argument of a call, of exactly ``type`` (borrowed); NULL with a TypeError otherwise */
static PyObject* sole_arg(PyObject* args, PyObject* kw, PyTypeObject* type, const char* message) {
    if ((kw != NULL && PyDict_GET_SIZE(kw) != 0) || PyTuple_GET_SIZE(args) != 1
            || !PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), type)) {
        PyErr_SetString(PyExc_TypeError, message);
        return NULL;
    }
    return PyTuple_GET_ITEM(args, 0);
}

/* the data pointer of tensor o into *out; -1 with an error set on failure */
static int tensor_ptr(PyObject* o, void** out) {
    PyObject* p = PyObject_CallMethodNoArgs(o, str_data_ptr);
    if (p == NULL) return -1;
    *out = PyLong_AsVoidPtr(p);
    Py_DECREF(p);
    return PyErr_Occurred() ? -1 : 0;
}

/* output k of launcher l, fresh: empty(*sizes), naming its dtype unless it is ``dd`` (the default dtype at the
   call; NULL: always named); its data pointer in *ptr. A new reference, or NULL with an error set */
static PyObject* launcher_output(Launcher* l, Py_ssize_t k, PyObject* dd, void** ptr) {
    PyObject* kwk = PyTuple_GET_ITEM(l->out_dtypes, k) == dd ? NULL : PyTuple_GET_ITEM(l->out_kw, k);
    PyObject* o = PyObject_Call(l->empty, PyTuple_GET_ITEM(l->out_args, k), kwk);
    if (o != NULL && tensor_ptr(o, ptr) < 0) Py_CLEAR(o);
    return o;
}

/* l's entry on ptrs with nth threads, under the lock of the launcher that owns its workspace; called with the
   GIL released. The entry's return code; *oom set where the workspace could not grow; the entry's seconds
   added to *tk (NULL: not timed) */
static int launcher_exec(Launcher* l, void** ptrs, int nth, int* oom, double* tk) {
    Launcher* o = l->owner != NULL ? (Launcher*)l->owner : l;
    long need = l->ws_floats + (long)nth * l->scratch_floats;
    if (need < 1) need = 1;
    int rc = 0;
    PyThread_acquire_lock(o->lock, WAIT_LOCK);
    if (grow_workspace(o, need) != 0) *oom = 1;
    else {
        const double t0 = tk != NULL ? prof_now() : 0.0;
        rc = l->fn(ptrs, o->ws, nth);
        if (tk != NULL) *tk += prof_now() - t0;
    }
    PyThread_release_lock(o->lock);
    return rc;
}

/* allocate the outputs, run the kernel on ins[0..nin) and them; a new list of the outputs */
static PyObject* launcher_run(Launcher* self, PyObject* const* ins, Py_ssize_t nin) {
    void* stack[24];
    const Py_ssize_t nptr = nin + self->nout + self->nwords;
    void** ptrs = nptr <= 24 ? stack : PyMem_Malloc(sizeof(void*) * (size_t)nptr);
    if (ptrs == NULL) return PyErr_NoMemory();
    for (Py_ssize_t j = 0; j < self->nwords; j++) ptrs[nin + self->nout + j] = self->words[j];
    PyObject* outs = PyList_New(self->nout);
    if (outs == NULL) goto fail;
    for (Py_ssize_t i = 0; i < nin; i++)
        if (tensor_ptr(ins[i], &ptrs[i]) < 0) goto fail;
    PyObject* dd = PyObject_CallNoArgs(self->default_dtype);
    if (dd == NULL) goto fail;
    Py_DECREF(dd);  /* dtypes are singletons kept by torch: compared by identity */
    for (Py_ssize_t k = 0; k < self->nout; k++) {
        PyObject* o = launcher_output(self, k, dd, &ptrs[nin + k]);
        if (o == NULL) goto fail;
        PyList_SET_ITEM(outs, k, o);
    }
    int nth = thread_count(self);
    if (nth < 0) goto fail;
    int rc, oom = 0;
    const int prof = prof_on;
    double tk = 0.0;
    Py_BEGIN_ALLOW_THREADS
    rc = launcher_exec(self, ptrs, nth, &oom, prof ? &tk : NULL);
    Py_END_ALLOW_THREADS
    if (prof && !oom) { prof_kernel_s += tk; prof_kernel_n++; }
    if (oom) { PyErr_NoMemory(); goto fail; }
    if (rc != 0) {
        PyErr_Format(PyExc_RuntimeError, "prism kernel returned error code %d", rc);
        goto fail;
    }
    if (ptrs != stack) PyMem_Free(ptrs);
    return outs;
fail:
    Py_XDECREF(outs);
    if (ptrs != stack) PyMem_Free(ptrs);
    return NULL;
}

static PyObject* Launcher_call(Launcher* self, PyObject* args, PyObject* kw) {
    PyObject* ins = sole_arg(args, kw, &PyList_Type, "a launcher takes one argument, the list of input tensors");
    if (ins == NULL) return NULL;
    return launcher_run(self, PySequence_Fast_ITEMS(ins), PyList_GET_SIZE(ins));
}

/* the workspace this launcher's calls use (its owner's): (floats allocated, the owner or None) */
static PyObject* Launcher_get_workspace(Launcher* self, void* closure) {
    (void)closure;
    Launcher* o = self->owner != NULL ? (Launcher*)self->owner : self;
    PyThread_acquire_lock(o->lock, WAIT_LOCK);
    long cap = o->ws_cap;
    PyThread_release_lock(o->lock);
    return Py_BuildValue("(lO)", cap, self->owner != NULL ? self->owner : Py_None);
}

static PyGetSetDef Launcher_getset[] = {
    {"workspace", (getter)Launcher_get_workspace, NULL, "(floats allocated, the owning launcher or None)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_prism_fastcall.Launcher",
    .tp_getset = Launcher_getset,
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel's per-call path on torch tensors (prism/runtime/fastcall.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_dealloc = (destructor)Launcher_dealloc,
    .tp_call = (ternaryfunc)Launcher_call,
};

/* --- Piece: the checked fast path of a PieceRunner (prism/frontend/runtime.py) ----------------------
   Piece(arg_index, dtypes, tensor_type, grad_enabled, compiled, counter)(args): for every input the kernel
   reads, args[arg_index[i]] must be a tensor (tensor_type) of dtypes[i], on the CPU, contiguous, and not
   requiring grad while grad mode is on; the tuple of their shapes must be a key of ``compiled`` (the runner's
   dict: shapes -> (launch, order)) with order None. Then it runs the launch and returns the list of outputs,
   adding one to counter["prism_calls"]. Anything else returns None (nothing has run): the runner's Python
   path decides, with the same checks and its messages. */
typedef struct {
    PyObject_HEAD
    Py_ssize_t n;
    Py_ssize_t* arg;
    PyObject* dtypes;
    PyTypeObject* tensor_type;
    PyObject* grad_enabled;
    PyObject* compiled;
    PyObject* counter;
} Piece;

static PyObject *one, *str_dtype, *str_is_cpu, *str_requires_grad, *str_is_contiguous, *str_shape, *str_prism_calls;

static void Piece_dealloc(Piece* self) {
    PyMem_Free(self->arg);
    Py_XDECREF(self->dtypes);
    Py_XDECREF((PyObject*)self->tensor_type);
    Py_XDECREF(self->grad_enabled);
    Py_XDECREF(self->compiled);
    Py_XDECREF(self->counter);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static int Piece_init(Piece* self, PyObject* args, PyObject* kw) {
    PyObject *arg, *dtypes, *tensor_type, *grad_enabled, *compiled, *counter;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!O!", &PyTuple_Type, &arg, &PyTuple_Type, &dtypes, &PyType_Type,
                          &tensor_type, &grad_enabled, &PyDict_Type, &compiled, &PyDict_Type, &counter))
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(arg);
    if (PyTuple_GET_SIZE(dtypes) != n || n > 64) {
        PyErr_SetString(PyExc_ValueError, "Piece: arg_index and dtypes differ in length (or more than 64)");
        return -1;
    }
    Py_ssize_t* a = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n ? n : 1));
    if (a == NULL) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        a[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(arg, i));
        if (a[i] < 0) {
            PyMem_Free(a);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Piece: negative index");
            return -1;
        }
    }
    PyMem_Free(self->arg);
    self->arg = a;
    self->n = n;
    Py_INCREF(dtypes); Py_XSETREF(self->dtypes, dtypes);
    Py_INCREF(tensor_type); Py_XSETREF(self->tensor_type, (PyTypeObject*)tensor_type);
    Py_INCREF(grad_enabled); Py_XSETREF(self->grad_enabled, grad_enabled);
    Py_INCREF(compiled); Py_XSETREF(self->compiled, compiled);
    Py_INCREF(counter); Py_XSETREF(self->counter, counter);
    return 0;
}

/* 1: attribute ``name`` of ``o`` is ``want``; 0: it is not; -1: error */
static int attr_is(PyObject* o, PyObject* name, PyObject* want) {
    PyObject* v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int r = v == want;
    Py_DECREF(v);
    return r;
}

/* a of ``type``, of ``dtype``, on the CPU, contiguous and, while grad mode is on (grad), not requiring grad:
   1 yes, 0 no, -1 error */
static int tensor_ok(PyObject* a, PyTypeObject* type, PyObject* dtype, int grad) {
    if (!PyObject_TypeCheck(a, type)) return 0;
    int r = attr_is(a, str_dtype, dtype);
    if (r == 1) r = attr_is(a, str_is_cpu, Py_True);
    if (r == 1 && grad) r = attr_is(a, str_requires_grad, Py_False);
    if (r != 1) return r;
    PyObject* c = PyObject_CallMethodNoArgs(a, str_is_contiguous);
    if (c == NULL) return -1;
    r = c == Py_True;
    Py_DECREF(c);
    return r;
}

/* d["prism_calls"] += 1 where d has that key: 0, or -1 with an error set */
static int count_call(PyObject* d) {
    PyObject* cnt = PyDict_GetItemWithError(d, str_prism_calls);
    if (cnt == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject* nxt = PyNumber_Add(cnt, one);
    if (nxt == NULL) return -1;
    const int r = PyDict_SetItem(d, str_prism_calls, nxt);
    Py_DECREF(nxt);
    return r;
}

static PyObject* Piece_call(Piece* self, PyObject* args, PyObject* kw) {
    PyObject* argv = sole_arg(args, kw, &PyTuple_Type,
                              "a Piece takes one argument, the tuple of the piece's arguments");
    if (argv == NULL) return NULL;
    const double t_in = prof_on ? prof_now() : 0.0;
    Py_ssize_t nargs = PyTuple_GET_SIZE(argv);
    PyObject* g = PyObject_CallNoArgs(self->grad_enabled);
    if (g == NULL) return NULL;
    int grad = g == Py_True;
    Py_DECREF(g);
    PyObject* ins[64];
    PyObject* shapes = PyTuple_New(self->n);
    if (shapes == NULL) return NULL;
    for (Py_ssize_t i = 0; i < self->n; i++) {
        if (self->arg[i] >= nargs) goto slow;
        PyObject* a = PyTuple_GET_ITEM(argv, self->arg[i]);
        const int r = tensor_ok(a, self->tensor_type, PyTuple_GET_ITEM(self->dtypes, i), grad);
        if (r < 0) goto error;
        if (r == 0) goto slow;
        PyObject* sh = PyObject_GetAttr(a, str_shape);
        if (sh == NULL) goto error;
        PyTuple_SET_ITEM(shapes, i, sh);
        ins[i] = a;
    }
    PyObject* hit = PyDict_GetItemWithError(self->compiled, shapes);  /* borrowed */
    if (hit == NULL) {
        if (PyErr_Occurred()) goto error;
        goto slow;
    }
    if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2 || PyTuple_GET_ITEM(hit, 1) != Py_None) goto slow;
    PyObject* launch = PyTuple_GET_ITEM(hit, 0);
    PyObject* outs;
    Py_INCREF(launch);
    if (Py_TYPE(launch) == &LauncherType) {
        outs = launcher_run((Launcher*)launch, ins, self->n);
    } else {
        PyObject* lst = PyList_New(self->n);
        if (lst == NULL) { Py_DECREF(launch); goto error; }
        for (Py_ssize_t i = 0; i < self->n; i++) { Py_INCREF(ins[i]); PyList_SET_ITEM(lst, i, ins[i]); }
        outs = PyObject_CallOneArg(launch, lst);
        Py_DECREF(lst);
    }
    Py_DECREF(launch);
    Py_DECREF(shapes);
    if (outs == NULL) return NULL;
    if (count_call(self->counter) < 0) {
        Py_DECREF(outs);
        return NULL;
    }
    if (prof_on && t_in > 0.0) { prof_piece_s += prof_now() - t_in; prof_piece_n++; }
    return outs;
slow:
    Py_DECREF(shapes);
    Py_RETURN_NONE;
error:
    Py_DECREF(shapes);
    return NULL;
}

static PyTypeObject PieceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_prism_fastcall.Piece",
    .tp_basicsize = sizeof(Piece),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A piece's checked per-call path (prism/runtime/fastcall.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Piece_init,
    .tp_dealloc = (destructor)Piece_dealloc,
    .tp_call = (ternaryfunc)Piece_call,
};

/* --- Guard: capture="export"'s input check (prism/frontend/direct.py) -----------------------------------
   Guard(specs, tensor_type)(args) -> bool: len(args) == len(specs), and per argument with spec
   (dtype, rank, shape or None, ((dim, size), ...)): a tensor (tensor_type) of that dtype, on the CPU, of that
   rank, equal to the whole shape when given, else with those sizes at the static dims; with spec
   ("value", v): an object of v's exact type equal to v. */
typedef struct {
    PyObject_HEAD
    PyObject* specs;
    PyTypeObject* tensor_type;
} Guard;

static void Guard_dealloc(Guard* self) {
    Py_XDECREF(self->specs);
    Py_XDECREF((PyObject*)self->tensor_type);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static int Guard_init(Guard* self, PyObject* args, PyObject* kw) {
    PyObject *specs, *tensor_type;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &specs, &PyType_Type, &tensor_type)) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(specs); i++) {
        PyObject* sp = PyTuple_GET_ITEM(specs, i);
        if (!PyTuple_Check(sp) || (PyTuple_GET_SIZE(sp) != 4 && PyTuple_GET_SIZE(sp) != 2)) {
            PyErr_SetString(PyExc_ValueError, "Guard: each spec is (dtype, rank, shape, static) or ('value', v)");
            return -1;
        }
    }
    Py_INCREF(specs); Py_XSETREF(self->specs, specs);
    Py_INCREF(tensor_type); Py_XSETREF(self->tensor_type, (PyTypeObject*)tensor_type);
    return 0;
}

/* 1 matches, 0 does not, -1 error */
static int guard_one(Guard* self, PyObject* a, PyObject* sp) {
    if (PyTuple_GET_SIZE(sp) == 2) {
        PyObject* v = PyTuple_GET_ITEM(sp, 1);
        if (Py_TYPE(a) != Py_TYPE(v)) return 0;
        return PyObject_RichCompareBool(a, v, Py_EQ);
    }
    if (!PyObject_TypeCheck(a, self->tensor_type)) return 0;
    int r = attr_is(a, str_dtype, PyTuple_GET_ITEM(sp, 0));
    if (r != 1) return r;
    r = attr_is(a, str_is_cpu, Py_True);
    if (r != 1) return r;
    PyObject* shape = PyObject_GetAttr(a, str_shape);
    if (shape == NULL) return -1;
    if (!PyTuple_Check(shape)) { Py_DECREF(shape); return 0; }
    Py_ssize_t rank = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 1));
    if (rank == -1 && PyErr_Occurred()) { Py_DECREF(shape); return -1; }
    if (PyTuple_GET_SIZE(shape) != rank) { Py_DECREF(shape); return 0; }
    PyObject* full = PyTuple_GET_ITEM(sp, 2);
    if (full != Py_None) {
        r = PyObject_RichCompareBool(shape, full, Py_EQ);
    } else {
        PyObject* st = PyTuple_GET_ITEM(sp, 3);
        r = 1;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(st) && r == 1; k++) {
            PyObject* pair = PyTuple_GET_ITEM(st, k);
            Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
            if (d < 0 || d >= rank) { r = PyErr_Occurred() ? -1 : 0; break; }
            r = PyObject_RichCompareBool(PyTuple_GET_ITEM(shape, d), PyTuple_GET_ITEM(pair, 1), Py_EQ);
        }
    }
    Py_DECREF(shape);
    return r;
}

static PyObject* Guard_call(Guard* self, PyObject* args, PyObject* kw) {
    PyObject* argv = sole_arg(args, kw, &PyTuple_Type,
                              "a Guard takes one argument, the tuple of the call's arguments");
    if (argv == NULL) return NULL;
    if (PyTuple_GET_SIZE(argv) != PyTuple_GET_SIZE(self->specs)) Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(argv); i++) {
        int r = guard_one(self, PyTuple_GET_ITEM(argv, i), PyTuple_GET_ITEM(self->specs, i));
        if (r < 0) return NULL;
        if (r == 0) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

static PyTypeObject GuardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_prism_fastcall.Guard",
    .tp_basicsize = sizeof(Guard),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "capture='export''s input check (prism/runtime/fastcall.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Guard_init,
    .tp_dealloc = (destructor)Guard_dealloc,
    .tp_call = (ternaryfunc)Guard_call,
};

/* --- Chain: consecutive steps of a rewritten graph in one call (prism/frontend/chain.py) --------------
   Chain(ext, tensor_type, grad_enabled, empty, steps, results, counters)(args) -> tuple of outputs, or None.
   Values: the external inputs 0..len(ext)-1, then one per step. ext: per external input (arg index, dtype,
   shape pattern): args[arg index] must be a tensor (tensor_type) of that dtype, of the pattern's rank and its
   sizes where they are >= 0 (-1: a dynamic size), on the CPU, contiguous, not requiring grad while grad mode
   is on. steps, in order, each a tuple whose first item is its kind:
     (0, srcs, launcher, buffer, shape)  a piece of static shapes: the value indices of its kernel's inputs, a
                                         one-output Launcher, the tensor its output is written to (owned by
                                         the chain, reused by every call) or None (fresh per call), its shape;
     (1, srcs, compiled, plan)           a piece with a dynamic input size: srcs in the runner's input order,
                                         ``compiled`` its runner's dict (tuple of input shapes -> (launcher,
                                         order or None)), ``plan`` its runner's ``_plan`` (called on a miss: a
                                         launcher or why not); its output is fresh per call;
     (2, srcs, dim, dtype)               torch.cat of the sources along ``dim`` (a fresh tensor).
   Phase 1, with the GIL: the checks, every value's shape, the launchers of dynamic steps and every fresh
   output; anything not as expected answers None and nothing has run. Phase 2: the kernels and copies in order
   with the GIL released once, under the chain's lock (one call at a time: the buffers are shared). results:
   the step indices whose outputs are returned; counters: dicts whose "prism_calls" is incremented per call. */
#define CHAIN_MAX_EXT 512
#define CHAIN_MAX_STEPS 512
#define CHAIN_MAX_SRC 16
#define CHAIN_MAX_RANK 8
#define CHAIN_PAR_COPY (1 << 16)   /* bytes of a cat from which its copy is split between threads */
enum { STEP_STATIC = 0, STEP_DYNAMIC = 1, STEP_CAT = 2 };

typedef struct {
    int kind;
    Launcher* launcher;     /* STEP_STATIC */
    PyObject* compiled;     /* STEP_DYNAMIC */
    PyObject* plan;         /* STEP_DYNAMIC */
    Py_ssize_t nsrc;
    Py_ssize_t* src;        /* value indices */
    PyObject* buffer;       /* STEP_STATIC internal value, or NULL */
    void* buf_ptr;
    int rank;               /* STEP_STATIC: the output's shape */
    Py_ssize_t shape[CHAIN_MAX_RANK];
    int dim;                /* STEP_CAT */
    PyObject* dtype;        /* STEP_CAT */
} ChainStep;

typedef struct {
    PyObject_HEAD
    Py_ssize_t next;
    Py_ssize_t* ext_arg;
    PyObject* ext_dtype;    /* tuple */
    int* ext_rank;
    Py_ssize_t* ext_shape;  /* next x CHAIN_MAX_RANK; -1: dynamic */
    PyTypeObject* tensor_type;
    PyObject* grad_enabled;
    PyObject* empty;
    Py_ssize_t nsteps;
    ChainStep* steps;
    PyObject* results;      /* tuple of step indices */
    PyObject* counters;     /* tuple of dicts */
    PyThread_type_lock lock;
} Chain;

/* one value of a call */
typedef struct {
    void* ptr;
    int rank;
    Py_ssize_t shape[CHAIN_MAX_RANK];
    Py_ssize_t itemsize;
    PyObject* obj;          /* owned: a fresh output; NULL otherwise */
} ChainValue;

static void chain_clear_steps(Chain* self) {
    for (Py_ssize_t i = 0; i < self->nsteps; i++) {
        Py_XDECREF((PyObject*)self->steps[i].launcher);
        Py_XDECREF(self->steps[i].compiled);
        Py_XDECREF(self->steps[i].plan);
        Py_XDECREF(self->steps[i].buffer);
        Py_XDECREF(self->steps[i].dtype);
        PyMem_Free(self->steps[i].src);
    }
    PyMem_Free(self->steps);
    self->steps = NULL;
    self->nsteps = 0;
}

static void Chain_dealloc(Chain* self) {
    chain_clear_steps(self);
    PyMem_Free(self->ext_arg);
    PyMem_Free(self->ext_rank);
    PyMem_Free(self->ext_shape);
    Py_XDECREF(self->ext_dtype);
    Py_XDECREF((PyObject*)self->tensor_type);
    Py_XDECREF(self->grad_enabled);
    Py_XDECREF(self->empty);
    Py_XDECREF(self->results);
    Py_XDECREF(self->counters);
    if (self->lock) PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

static int chain_bad(const char* msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
}

/* a tuple of ints into out[0..rank); -1 on error (ValueError set when not a tuple of ints of rank <= 8) */
static int int_tuple(PyObject* t, Py_ssize_t* out, int* rank) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > CHAIN_MAX_RANK)
        return chain_bad("Chain: a shape is a tuple of <= 8 ints");
    *rank = (int)PyTuple_GET_SIZE(t);
    for (int d = 0; d < *rank; d++) {
        out[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, d));
        if (out[d] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int chain_srcs(ChainStep* cs, PyObject* srcs, Py_ssize_t limit) {
    if (!PyTuple_Check(srcs)) return chain_bad("Chain: sources are a tuple");
    cs->nsrc = PyTuple_GET_SIZE(srcs);
    if (cs->nsrc > CHAIN_MAX_SRC) return chain_bad("Chain: at most 16 sources per step");
    cs->src = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(cs->nsrc ? cs->nsrc : 1));
    if (cs->src == NULL) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t j = 0; j < cs->nsrc; j++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(srcs, j));
        if (s == -1 && PyErr_Occurred()) return -1;
        if (s < 0 || s >= limit) return chain_bad("Chain: a source is not an external input or an earlier step");
        cs->src[j] = s;
    }
    return 0;
}

static int Chain_init(Chain* self, PyObject* args, PyObject* kw) {
    PyObject *ext, *tensor_type, *grad_enabled, *empty, *steps, *results, *counters;
    if (!PyArg_ParseTuple(args, "O!O!OOO!O!O!", &PyTuple_Type, &ext, &PyType_Type, &tensor_type, &grad_enabled,
                          &empty, &PyTuple_Type, &steps, &PyTuple_Type, &results, &PyTuple_Type, &counters))
        return -1;
    if (self->steps != NULL || self->ext_arg != NULL) return chain_bad("Chain: already initialized");
    Py_ssize_t next = PyTuple_GET_SIZE(ext), nsteps = PyTuple_GET_SIZE(steps);
    if (next > CHAIN_MAX_EXT || nsteps > CHAIN_MAX_STEPS || nsteps < 1)
        return chain_bad("Chain: 1 to 512 steps and at most 512 external inputs");
    self->ext_dtype = PyTuple_New(next);
    self->ext_arg = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(next ? next : 1));
    self->ext_rank = PyMem_Malloc(sizeof(int) * (size_t)(next ? next : 1));
    self->ext_shape = PyMem_Malloc(sizeof(Py_ssize_t) * CHAIN_MAX_RANK * (size_t)(next ? next : 1));
    self->steps = PyMem_Calloc((size_t)nsteps, sizeof(ChainStep));
    if (!self->ext_dtype || !self->ext_arg || !self->ext_rank || !self->ext_shape || !self->steps) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t e = 0; e < next; e++) {
        PyObject* sp = PyTuple_GET_ITEM(ext, e);
        if (!PyTuple_Check(sp) || PyTuple_GET_SIZE(sp) != 3)
            return chain_bad("Chain: each external input is (arg index, dtype, shape pattern)");
        self->ext_arg[e] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 0));
        if (self->ext_arg[e] < 0) return PyErr_Occurred() ? -1 : chain_bad("Chain: negative arg index");
        Py_INCREF(PyTuple_GET_ITEM(sp, 1));
        PyTuple_SET_ITEM(self->ext_dtype, e, PyTuple_GET_ITEM(sp, 1));
        if (int_tuple(PyTuple_GET_ITEM(sp, 2), self->ext_shape + e * CHAIN_MAX_RANK, &self->ext_rank[e]) < 0)
            return -1;
    }
    self->next = next;
    for (Py_ssize_t i = 0; i < nsteps; i++) {
        PyObject* st = PyTuple_GET_ITEM(steps, i);
        ChainStep* cs = &self->steps[i];
        self->nsteps = i + 1;  /* cleared up to here on failure */
        if (!PyTuple_Check(st) || PyTuple_GET_SIZE(st) < 1) return chain_bad("Chain: a step is a tuple");
        if (PyTuple_GET_SIZE(st) < 2) return chain_bad("Chain: a step is (kind, srcs, ...)");
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(st, 0));
        if (kind == -1 && PyErr_Occurred()) return -1;
        cs->kind = (int)kind;
        if (chain_srcs(cs, PyTuple_GET_ITEM(st, 1), next + i) < 0) return -1;
        if (kind == STEP_STATIC) {
            if (PyTuple_GET_SIZE(st) != 5 || Py_TYPE(PyTuple_GET_ITEM(st, 2)) != &LauncherType)
                return chain_bad("Chain: a static step is (0, srcs, Launcher, buffer or None, shape)");
            Launcher* l = (Launcher*)PyTuple_GET_ITEM(st, 2);
            if (l->nout != 1) return chain_bad("Chain: a step's launcher has one output");
            Py_INCREF(l);
            cs->launcher = l;
            if (cs->nsrc + 1 + l->nwords > 24) return chain_bad("Chain: too many kernel arguments");
            if (int_tuple(PyTuple_GET_ITEM(st, 4), cs->shape, &cs->rank) < 0) return -1;
            PyObject* buf = PyTuple_GET_ITEM(st, 3);
            if (buf != Py_None) {
                if (!PyObject_TypeCheck(buf, (PyTypeObject*)tensor_type))
                    return chain_bad("Chain: a buffer is a tensor");
                if (tensor_ptr(buf, &cs->buf_ptr) < 0) return -1;
                Py_INCREF(buf);
                cs->buffer = buf;
            }
        } else if (kind == STEP_DYNAMIC) {
            if (PyTuple_GET_SIZE(st) != 4 || !PyDict_Check(PyTuple_GET_ITEM(st, 2))
                    || !PyCallable_Check(PyTuple_GET_ITEM(st, 3)))
                return chain_bad("Chain: a dynamic step is (1, srcs, compiled dict, plan)");
            Py_INCREF(PyTuple_GET_ITEM(st, 2)); cs->compiled = PyTuple_GET_ITEM(st, 2);
            Py_INCREF(PyTuple_GET_ITEM(st, 3)); cs->plan = PyTuple_GET_ITEM(st, 3);
        } else if (kind == STEP_CAT) {
            if (PyTuple_GET_SIZE(st) != 4) return chain_bad("Chain: a cat step is (2, srcs, dim, dtype)");
            if (cs->nsrc < 1) return chain_bad("Chain: a cat has sources");
            long d = PyLong_AsLong(PyTuple_GET_ITEM(st, 2));
            if (d == -1 && PyErr_Occurred()) return -1;
            if (d < 0 || d >= CHAIN_MAX_RANK) return chain_bad("Chain: a cat's dim is normalized (0 <= dim < 8)");
            cs->dim = (int)d;
            Py_INCREF(PyTuple_GET_ITEM(st, 3)); cs->dtype = PyTuple_GET_ITEM(st, 3);
        } else {
            return chain_bad("Chain: unknown step kind");
        }
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(results); k++) {
        Py_ssize_t r = PyLong_AsSsize_t(PyTuple_GET_ITEM(results, k));
        if (r == -1 && PyErr_Occurred()) return -1;
        if (r < 0 || r >= nsteps || self->steps[r].buffer != NULL)
            return chain_bad("Chain: a result is a step whose output is fresh per call");
    }
    Py_INCREF(tensor_type); self->tensor_type = (PyTypeObject*)tensor_type;
    Py_INCREF(grad_enabled); self->grad_enabled = grad_enabled;
    Py_INCREF(empty); self->empty = empty;
    Py_INCREF(results); self->results = results;
    Py_INCREF(counters); self->counters = counters;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) { PyErr_NoMemory(); return -1; }
    return 0;
}

/* a fresh output of a one-output launcher (its dtype always named); its pointer and shape in *v */
static int launcher_new_output(Launcher* l, ChainValue* v) {
    PyObject* sizes = PyTuple_GET_ITEM(l->out_args, 0);
    /* empty(*sizes); a 0-d output's sizes are ((),) */
    PyObject* dims = PyTuple_GET_SIZE(sizes) == 1 && PyTuple_Check(PyTuple_GET_ITEM(sizes, 0))
                     ? PyTuple_GET_ITEM(sizes, 0) : sizes;
    if (int_tuple(dims, v->shape, &v->rank) < 0) return -1;
    v->obj = launcher_output(l, 0, NULL, &v->ptr);
    return v->obj == NULL ? -1 : 0;
}

static PyObject* shape_tuple(const ChainValue* v) {
    PyObject* t = PyTuple_New(v->rank);
    if (t == NULL) return NULL;
    for (int d = 0; d < v->rank; d++) {
        PyObject* n = PyLong_FromSsize_t(v->shape[d]);
        if (n == NULL) { Py_DECREF(t); return NULL; }
        PyTuple_SET_ITEM(t, d, n);
    }
    return t;
}

/* the checked external input e of a call into *v: 1 taken, 0 not this chain's, -1 error */
static int chain_ext(Chain* self, Py_ssize_t e, PyObject* a, int grad, ChainValue* v) {
    const int r = tensor_ok(a, self->tensor_type, PyTuple_GET_ITEM(self->ext_dtype, e), grad);
    if (r != 1) return r;
    PyObject* sh = PyObject_GetAttr(a, str_shape);
    if (sh == NULL) return -1;
    const Py_ssize_t* want = self->ext_shape + e * CHAIN_MAX_RANK;
    if (!PyTuple_Check(sh) || PyTuple_GET_SIZE(sh) != self->ext_rank[e]) { Py_DECREF(sh); return 0; }
    v->rank = self->ext_rank[e];
    for (int d = 0; d < v->rank; d++) {
        v->shape[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sh, d));
        if (v->shape[d] == -1 && PyErr_Occurred()) { Py_DECREF(sh); return -1; }
        if (want[d] >= 0 && v->shape[d] != want[d]) { Py_DECREF(sh); return 0; }
    }
    Py_DECREF(sh);
    return tensor_ptr(a, &v->ptr) < 0 ? -1 : 1;
}

static Py_ssize_t itemsize_of(PyObject* dtype) {
    PyObject* s = PyObject_GetAttrString(dtype, "itemsize");
    if (s == NULL) return -1;
    Py_ssize_t n = PyLong_AsSsize_t(s);
    Py_DECREF(s);
    return n;
}

static PyObject* Chain_call(Chain* self, PyObject* args, PyObject* kw) {
    PyObject* argv = sole_arg(args, kw, &PyTuple_Type, "a Chain takes one argument, the tuple of its arguments");
    if (argv == NULL) return NULL;
    if (self->steps == NULL) { PyErr_SetString(PyExc_RuntimeError, "Chain: not initialized"); return NULL; }
    const int prof = prof_on;
    const double t_in = prof ? prof_now() : 0.0;
    PyObject* g = PyObject_CallNoArgs(self->grad_enabled);
    if (g == NULL) return NULL;
    const int grad = g == Py_True;
    Py_DECREF(g);
    const Py_ssize_t next = self->next, n = self->nsteps, nargs = PyTuple_GET_SIZE(argv);
    ChainValue* vals = PyMem_Calloc((size_t)(next + n), sizeof(ChainValue));
    Launcher** run = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Launcher*));   /* per piece step: its launcher */
    Py_ssize_t* order = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(n * CHAIN_MAX_SRC + 1));  /* kernel srcs */
    int* nth = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    PyObject* result = NULL;
    int mine = 1;   /* 0: answer None */
    if (!vals || !run || !order || !nth) { PyErr_NoMemory(); goto done; }
    /* phase 1: checks, shapes, launchers, fresh outputs */
    for (Py_ssize_t e = 0; e < next; e++) {
        if (self->ext_arg[e] >= nargs) { mine = 0; goto done; }
        int r = chain_ext(self, e, PyTuple_GET_ITEM(argv, self->ext_arg[e]), grad, &vals[e]);
        if (r < 0) goto done;
        if (r == 0) { mine = 0; goto done; }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ChainStep* cs = &self->steps[i];
        ChainValue* out = &vals[next + i];
        Py_ssize_t* ko = order + i * CHAIN_MAX_SRC;
        if (cs->kind == STEP_STATIC) {
            run[i] = cs->launcher;
            for (Py_ssize_t j = 0; j < cs->nsrc; j++) ko[j] = cs->src[j];
            if (cs->buffer != NULL) {
                out->ptr = cs->buf_ptr;
                out->rank = cs->rank;
                memcpy(out->shape, cs->shape, sizeof(Py_ssize_t) * (size_t)cs->rank);
            } else if (launcher_new_output(cs->launcher, out) < 0) goto done;
        } else if (cs->kind == STEP_DYNAMIC) {
            PyObject* key = PyTuple_New(cs->nsrc);
            if (key == NULL) goto done;
            for (Py_ssize_t j = 0; j < cs->nsrc; j++) {
                PyObject* t = shape_tuple(&vals[cs->src[j]]);
                if (t == NULL) { Py_DECREF(key); goto done; }
                PyTuple_SET_ITEM(key, j, t);
            }
            PyObject* hit = PyDict_GetItemWithError(cs->compiled, key);  /* borrowed */
            Py_XINCREF(hit);
            if (hit == NULL && !PyErr_Occurred()) {
                PyObject* empty_args = PyTuple_New(0);
                hit = empty_args == NULL ? NULL : PyObject_CallFunctionObjArgs(cs->plan, key, empty_args, NULL);
                Py_XDECREF(empty_args);
                if (hit == NULL) PyErr_Clear();   /* the pieces one by one say why */
            }
            Py_DECREF(key);
            if (hit == NULL) { if (PyErr_Occurred()) goto done; mine = 0; goto done; }
            if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2 || Py_TYPE(PyTuple_GET_ITEM(hit, 0)) != &LauncherType
                    || ((Launcher*)PyTuple_GET_ITEM(hit, 0))->nout != 1) {
                Py_DECREF(hit);
                mine = 0;
                goto done;
            }
            Launcher* l = (Launcher*)PyTuple_GET_ITEM(hit, 0);
            PyObject* perm = PyTuple_GET_ITEM(hit, 1);
            int ok = cs->nsrc + 1 + l->nwords <= 24;
            for (Py_ssize_t j = 0; j < cs->nsrc && ok; j++) {
                Py_ssize_t p = j;
                if (perm != Py_None) {
                    p = PyTuple_Check(perm) && j < PyTuple_GET_SIZE(perm)
                        ? PyLong_AsSsize_t(PyTuple_GET_ITEM(perm, j)) : -1;
                    if (p < 0 || p >= cs->nsrc) { PyErr_Clear(); ok = 0; break; }
                }
                ko[j] = cs->src[p];
            }
            run[i] = l;   /* a reference of this call's: the runner's dict may drop the entry meanwhile */
            Py_INCREF(l);
            Py_DECREF(hit);
            if (!ok) { mine = 0; goto done; }
            if (launcher_new_output(l, out) < 0) goto done;
        } else {  /* STEP_CAT */
            const ChainValue* first = &vals[cs->src[0]];
            if (cs->dim >= first->rank) { mine = 0; goto done; }
            out->rank = first->rank;
            memcpy(out->shape, first->shape, sizeof(Py_ssize_t) * (size_t)first->rank);
            out->shape[cs->dim] = 0;
            for (Py_ssize_t j = 0; j < cs->nsrc; j++) {
                const ChainValue* s = &vals[cs->src[j]];
                if (s->rank != first->rank) { mine = 0; goto done; }
                for (int d = 0; d < s->rank; d++)
                    if (d != cs->dim && s->shape[d] != first->shape[d]) { mine = 0; goto done; }
                out->shape[cs->dim] += s->shape[cs->dim];
            }
            out->itemsize = itemsize_of(cs->dtype);
            if (out->itemsize <= 0) goto done;
            PyObject* sizes = shape_tuple(out);
            if (sizes == NULL) goto done;
            PyObject* kwd = Py_BuildValue("{s:O}", "dtype", cs->dtype);
            PyObject* a1 = kwd == NULL ? NULL : PyTuple_Pack(1, sizes);
            out->obj = a1 == NULL ? NULL : PyObject_Call(self->empty, a1, kwd);
            Py_XDECREF(a1); Py_XDECREF(kwd); Py_DECREF(sizes);
            if (out->obj == NULL || tensor_ptr(out->obj, &out->ptr) < 0) goto done;
        }
        if (run[i] != NULL && (nth[i] = thread_count(run[i])) < 0) goto done;
    }
    /* phase 2: the kernels and copies */
    int cat_threads = 1;   /* the cats' copies: as many threads as the chain's kernels */
    for (Py_ssize_t i = 0; i < n; i++)
        if (run[i] != NULL && nth[i] > cat_threads) cat_threads = nth[i];
    int rc = 0, oom = 0;
    double tk = 0.0;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    for (Py_ssize_t i = 0; i < n && rc == 0 && !oom; i++) {
        ChainStep* cs = &self->steps[i];
        ChainValue* out = &vals[next + i];
        if (cs->kind == STEP_CAT) {
            /* contiguous sources, all sizes equal but dim's: per index of the leading dims, each source's
               block. A KV cache of L positions is copied whole at every decode step (DynamicCache): from
               CHAIN_PAR_COPY bytes the leading indices are split between the threads (one core's copy from
               DRAM is ~half of what two move) */
            Py_ssize_t outer = 1, inner = out->itemsize;
            for (int d = 0; d < cs->dim; d++) outer *= out->shape[d];
            for (int d = cs->dim + 1; d < out->rank; d++) inner *= out->shape[d];
            size_t block[CHAIN_MAX_SRC], row = 0;
            for (Py_ssize_t j = 0; j < cs->nsrc; j++) {
                block[j] = (size_t)(vals[cs->src[j]].shape[cs->dim] * inner);
                row += block[j];
            }
            char* const dst = out->ptr;
            const int par = outer > 1 && (size_t)outer * row >= CHAIN_PAR_COPY ? cat_threads : 1;
            #pragma omp parallel for num_threads(par) schedule(static) if (par > 1)
            for (Py_ssize_t o = 0; o < outer; o++) {
                char* d = dst + (size_t)o * row;
                for (Py_ssize_t j = 0; j < cs->nsrc; j++) {
                    memcpy(d, (const char*)vals[cs->src[j]].ptr + (size_t)o * block[j], block[j]);
                    d += block[j];
                }
            }
            continue;
        }
        Launcher* l = run[i];
        const Py_ssize_t* ko = order + i * CHAIN_MAX_SRC;
        void* ptrs[24];
        for (Py_ssize_t j = 0; j < cs->nsrc; j++) ptrs[j] = vals[ko[j]].ptr;
        ptrs[cs->nsrc] = out->ptr;
        for (Py_ssize_t j = 0; j < l->nwords; j++) ptrs[cs->nsrc + 1 + j] = l->words[j];
        rc = launcher_exec(l, ptrs, nth[i], &oom, prof ? &tk : NULL);
    }
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (oom) { PyErr_NoMemory(); goto done; }
    if (rc != 0) { PyErr_Format(PyExc_RuntimeError, "prism kernel returned error code %d", rc); goto done; }
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(self->counters); c++)
        if (count_call(PyTuple_GET_ITEM(self->counters, c)) < 0) goto done;
    const Py_ssize_t nres = PyTuple_GET_SIZE(self->results);
    result = PyTuple_New(nres);
    if (result == NULL) goto done;
    for (Py_ssize_t k = 0; k < nres; k++) {
        PyObject* v = vals[next + PyLong_AsSsize_t(PyTuple_GET_ITEM(self->results, k))].obj;
        Py_INCREF(v);
        PyTuple_SET_ITEM(result, k, v);
    }
    if (prof) {
        Py_ssize_t pieces = 0;
        for (Py_ssize_t i = 0; i < n; i++) pieces += self->steps[i].kind != STEP_CAT;
        prof_kernel_s += tk; prof_kernel_n += pieces;
        prof_piece_s += prof_now() - t_in; prof_piece_n += pieces;
    }
done:
    if (vals != NULL)
        for (Py_ssize_t i = 0; i < next + n; i++) Py_XDECREF(vals[i].obj);
    if (run != NULL)
        for (Py_ssize_t i = 0; i < n; i++)
            if (self->steps[i].kind == STEP_DYNAMIC) Py_XDECREF((PyObject*)run[i]);
    PyMem_Free(vals); PyMem_Free(run); PyMem_Free(order); PyMem_Free(nth);
    if (result == NULL && mine && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "Chain: failed");
    if (!mine && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

static PyTypeObject ChainType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_prism_fastcall.Chain",
    .tp_basicsize = sizeof(Chain),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Consecutive pieces in one call (prism/runtime/fastcall.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Chain_init,
    .tp_dealloc = (destructor)Chain_dealloc,
    .tp_call = (ternaryfunc)Chain_call,
};

/* profile(on) -> (on, kernel seconds, kernel calls, piece seconds, piece calls) before the call; on: 1 turns
   the accounting on, 0 off, -1 leaves it */
static PyObject* mod_profile(PyObject* m, PyObject* args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|i", &on)) return NULL;
    PyObject* r = Py_BuildValue("(idLdL)", prof_on, prof_kernel_s, prof_kernel_n, prof_piece_s, prof_piece_n);
    if (on >= 0) prof_on = on != 0;
    return r;
}

static PyMethodDef mod_methods[] = {
    {"profile", mod_profile, METH_VARARGS, "profile(on=-1): the time accounting (prism/runtime/fastcall.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_prism_fastcall", NULL, -1, mod_methods};

PyMODINIT_FUNC PyInit__prism_fastcall(void) {
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&PieceType) < 0 || PyType_Ready(&GuardType) < 0
            || PyType_Ready(&ChainType) < 0)
        return NULL;
    str_data_ptr = PyUnicode_InternFromString("data_ptr");
    str_dtype = PyUnicode_InternFromString("dtype");
    str_is_cpu = PyUnicode_InternFromString("is_cpu");
    str_requires_grad = PyUnicode_InternFromString("requires_grad");
    str_is_contiguous = PyUnicode_InternFromString("is_contiguous");
    str_shape = PyUnicode_InternFromString("shape");
    str_prism_calls = PyUnicode_InternFromString("prism_calls");
    one = PyLong_FromLong(1);
    if (!one || !str_data_ptr || !str_dtype || !str_is_cpu || !str_requires_grad || !str_is_contiguous || !str_shape
            || !str_prism_calls) return NULL;
    PyObject* m = PyModule_Create(&moddef);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    Py_INCREF(&PieceType);
    Py_INCREF(&GuardType);
    Py_INCREF(&ChainType);
    if (PyModule_AddObject(m, "Chain", (PyObject*)&ChainType) < 0
            || PyModule_AddObject(m, "Launcher", (PyObject*)&LauncherType) < 0
            || PyModule_AddObject(m, "Piece", (PyObject*)&PieceType) < 0
            || PyModule_AddObject(m, "Guard", (PyObject*)&GuardType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
"""

# -fopenmp: a chain splits a long copy between threads (the kernels need OpenMP anyway)
FLAGS = ("-O2", "-shared", "-fPIC", "-fopenmp", "-std=gnu11", "-Werror=implicit-function-declaration")
_LOCK = threading.Lock()
_MOD: list[Any] = []       # [the extension module or None] once decided in this process
WHY_NOT: list[str] = []    # why the C launcher is not used (tests and `prism` diagnostics read it)


def _compile(so: Path, include: str, cc: list[str]) -> Path:
    src = cache.atomic_write(so.parent / f"{MODULE}.c", SOURCE.encode())
    fd, tmp = cache.make_tmp(src.parent, so.name, ".tmp.so")
    os.close(fd)
    try:
        cmd = [*cc, *FLAGS, f"-I{include}", str(src), "-o", str(tmp)]
        r = cache.run_compiler(cmd, "the C launcher")
        if r.returncode != 0:
            tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-10:])
            raise OSError(f"the C compiler failed on {src} (exit {r.returncode}):\n{tail}")
        os.chmod(tmp, 0o755)
        out = src.parent / so.name
        os.replace(tmp, out)
        return out
    finally:
        Path(tmp).unlink(missing_ok=True)


def _load(so: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(MODULE, str(so))
    spec = importlib.util.spec_from_file_location(MODULE, so, loader=loader)
    if spec is None:
        raise OSError(f"cannot load {so}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _build() -> Any:
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise OSError(f"no Python.h under {include} (install the Python development headers, e.g. python3-dev)")
    cc = cache.compiler()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha256("\0".join([SOURCE, include, " ".join(cc), " ".join(FLAGS), cache.compiler_version(),
                                    suffix, str(sys.hexversion)]).encode()).hexdigest()[:32]
    so = cache.readable(cache.cache_dir() / "ext" / key / f"{MODULE}{suffix}")
    if so.is_file():
        try:
            return _load(so)
        except ImportError as e:  # a damaged file: built again below
            LOG.debug("prism: rebuilding the C launcher %s: %s", so, e)
    return _load(_compile(so, include, cc))


def extension() -> Any:
    """The extension module (types ``Launcher`` and ``Piece``), built and loaded on first use; None where it
    cannot be (the reason is in ``WHY_NOT`` and the ``prism`` log) or ``PRISM_C_LAUNCHER=0``."""
    if _MOD:
        return _MOD[0]
    with _LOCK:
        if _MOD:
            return _MOD[0]
        m = None
        if os.environ.get("PRISM_C_LAUNCHER", "").strip() == "0":
            WHY_NOT.append("PRISM_C_LAUNCHER=0")
        else:
            try:
                m = _build()
            except Exception as e:  # any failure: the Python launcher runs the same kernels
                WHY_NOT.append(f"{type(e).__name__}: {e}")
                LOG.debug("prism: the C launcher is not available, kernels are called through ctypes: %s", e)
        _MOD.append(m)
        return m


def launcher_type() -> Any:
    """The C ``Launcher`` type, or None (see :func:`extension`)."""
    m = extension()
    return None if m is None else m.Launcher


def piece_type() -> Any:
    """The C ``Piece`` type, or None (see :func:`extension`)."""
    m = extension()
    return None if m is None else m.Piece


def chain_type() -> Any:
    """The C ``Chain`` type, or None (see :func:`extension`)."""
    m = extension()
    return None if m is None else m.Chain


def guard_type() -> Any:
    """The C ``Guard`` type, or None (see :func:`extension`)."""
    m = extension()
    return None if m is None else m.Guard


@dataclass(frozen=True)
class Profile:
    """Time accounted while profiling was on (:func:`set_profiling`): ``kernel_s`` inside kernel entries
    (``kernels`` calls), ``piece_s`` inside the frontend's piece calls -- checks, output allocation, launch and
    kernel -- (``pieces`` calls). ``piece_s - kernel_s`` is the per-call cost of the pieces; what a caller
    measures beyond ``piece_s`` ran outside Prism (the graph's other operators, Dynamo, the caller's code)."""

    kernel_s: float = 0.0
    kernels: int = 0
    piece_s: float = 0.0
    pieces: int = 0

    def __sub__(self, other: Profile) -> Profile:
        return Profile(self.kernel_s - other.kernel_s, self.kernels - other.kernels,
                       self.piece_s - other.piece_s, self.pieces - other.pieces)


# profiling state of the Python paths (the ctypes launcher, a piece's checked Python path): [on] and the
# totals [kernel_s, kernels, piece_s, pieces]; the C extension keeps its own (mod_profile above)
PROFILING = [False]
_PY_TOTALS = [0.0, 0, 0.0, 0]


def set_profiling(on: bool) -> None:
    """Account the time of kernels and piece calls from now on (``on``) or stop. Off, a call costs one branch;
    on, two clock reads per kernel and per piece call (~50 ns)."""
    PROFILING[0] = bool(on)
    m = extension()
    if m is not None:
        m.profile(1 if on else 0)


def add_kernel_time(seconds: float) -> None:
    _PY_TOTALS[0] += seconds
    _PY_TOTALS[1] += 1


def add_piece_time(seconds: float) -> None:
    _PY_TOTALS[2] += seconds
    _PY_TOTALS[3] += 1


def profile_totals() -> Profile:
    """The totals accounted so far in this process (subtract two readings for an interval)."""
    k, kn, p, pn = _PY_TOTALS
    m = extension()
    if m is not None:
        _, ck, ckn, cp, cpn = m.profile()
        k, kn, p, pn = k + ck, kn + ckn, p + cp, pn + cpn
    return Profile(k, int(kn), p, int(pn))


def reset() -> None:
    """Forget the decision (tests)."""
    with _LOCK:
        _MOD.clear()
        WHY_NOT.clear()
