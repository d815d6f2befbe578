/* The hot path of `gpuprof.phase` in C: an optional speed-up of gpuprof/hooks.py.
 *
 * `hooks.phase` subclasses `_cphase.PhaseBase` when this module builds; without it the
 * pure-Python class of the same behaviour is used. Only the recording fast path lives here:
 * enter reads CLOCK_MONOTONIC (time.monotonic_ns's clock), exit ticks the recorder's
 * counter and appends one tuple (name, attrs, start, end, thread ident, step) to its bounded
 * deque. Everything else (outside a run, the first hook of a process, CUDA-timed spans,
 * a span left by an exception) calls the Python methods `_enter_slow` / `_exit_slow`.
 * Nothing here raises into user code: an error in the fast path is handed to the registered
 * `disable` callback (which turns the hooks off) and cleared.
 *
 * The state is set by `hooks._set_recorder` through `set_fast`, under the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"
#include <pythread.h>
#include <time.h>

#ifndef CLOCK_MONOTONIC
#error "CLOCK_MONOTONIC is required (the pure-Python hooks are used instead)"
#endif

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *attrs; /* NULL: no attributes (stored as None) */
    PyObject *gpu;   /* CUDA event pair of the slow path, or NULL */
    long long start; /* monotonic ns when entered */
    char started;    /* `start` holds a time (the `_start` of the Python class is not None) */
} PhaseObject;

/* The recording state: all NULL/0 when the fast path is off. */
static PyObject *fast_recorder = NULL; /* the recorder (its `step` is read at exit) */
static PyObject *fast_tick = NULL;     /* the recorder's counter's __next__ */
static PyObject *fast_append = NULL;   /* the recorder's deque's append */
static int outside_run = 0;            /* checked, and no run: enter and exit do nothing */
static PyObject *disable_cb = NULL;    /* hooks._disable(exc) */
static PyObject *str_step = NULL;
static PyObject *str_name = NULL;
static PyObject *str_enter_slow = NULL;
static PyObject *str_exit_slow = NULL;

static inline long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* An error happened in the hooks: hand it to `disable` and clear it, never propagate. */
static void
swallow_error(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (disable_cb != NULL && value != NULL) {
        PyObject *res = PyObject_CallOneArg(disable_cb, value);
        Py_XDECREF(res);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

static int
Phase_init(PhaseObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *name = NULL;
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    PyObject *attrs = NULL;
    if (nargs == 1) {
        name = PyTuple_GET_ITEM(args, 0);
        if (kwds != NULL && PyDict_GET_SIZE(kwds) > 0) {
            int has_name = PyDict_Contains(kwds, str_name);
            if (has_name != 0) {
                if (has_name > 0)
                    PyErr_SetString(PyExc_TypeError, "phase() got multiple values for 'name'");
                return -1;
            }
            /* a dict of its own, as `**attrs` gives the Python class */
            attrs = PyDict_Copy(kwds);
            if (attrs == NULL)
                return -1;
        }
    }
    else if (nargs == 0 && kwds != NULL && (name = PyDict_GetItemWithError(kwds, str_name)) != NULL) {
        attrs = PyDict_Copy(kwds);
        if (attrs == NULL || PyDict_DelItem(attrs, str_name) < 0) {
            Py_XDECREF(attrs);
            return -1;
        }
        if (PyDict_GET_SIZE(attrs) == 0)
            Py_CLEAR(attrs);
    }
    else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError,
                         "phase() takes one positional argument, the name (%zd given)", nargs);
        return -1;
    }
    Py_INCREF(name);
    Py_XSETREF(self->name, name);
    Py_XSETREF(self->attrs, attrs);
    self->started = 0;
    return 0;
}

static int
Phase_traverse(PhaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->name);
    Py_VISIT(self->attrs);
    Py_VISIT(self->gpu);
    return 0;
}

static int
Phase_clear(PhaseObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->attrs);
    Py_CLEAR(self->gpu);
    return 0;
}

static void
Phase_dealloc(PhaseObject *self)
{
    /* a static type: the heap subclass's own dealloc releases its type */
    PyObject_GC_UnTrack(self);
    Phase_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Phase_enter(PhaseObject *self, PyObject *Py_UNUSED(ignored))
{
    if (fast_recorder != NULL) {
        self->start = monotonic_ns();
        self->started = 1;
        Py_INCREF(self);
        return (PyObject *)self;
    }
    if (outside_run) {
        self->started = 0;
        Py_INCREF(self);
        return (PyObject *)self;
    }
    /* the slow path disables the hooks itself on an error; should anything still escape
       it, the span is not recorded and the user's code goes on */
    PyObject *res = PyObject_CallMethodNoArgs((PyObject *)self, str_enter_slow);
    if (res == NULL) {
        swallow_error();
        self->started = 0;
        Py_INCREF(self);
        return (PyObject *)self;
    }
    return res;
}

static PyObject *
Phase_exit(PhaseObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    if (!self->started)
        Py_RETURN_FALSE;
    long long end = monotonic_ns();
    if (fast_recorder != NULL && exc_type == Py_None) {
        PyObject *recorder = fast_recorder, *tick = fast_tick, *append = fast_append;
        Py_INCREF(recorder);
        Py_INCREF(tick);
        Py_INCREF(append);
        PyObject *item = NULL, *res = NULL;
        PyObject *step = PyObject_GetAttr(recorder, str_step);
        if (step == NULL)
            goto fail;
        item = PyTuple_New(6);
        if (item == NULL)
            goto fail;
        /* a name deleted by hand (`del p.name`) reads as None, as the member does */
        PyObject *name = self->name != NULL ? self->name : Py_None;
        Py_INCREF(name);
        PyTuple_SET_ITEM(item, 0, name);
        PyObject *attrs = self->attrs != NULL ? self->attrs : Py_None;
        Py_INCREF(attrs);
        PyTuple_SET_ITEM(item, 1, attrs);
        PyObject *v;
        if ((v = PyLong_FromLongLong(self->start)) == NULL)
            goto fail;
        PyTuple_SET_ITEM(item, 2, v);
        if ((v = PyLong_FromLongLong(end)) == NULL)
            goto fail;
        PyTuple_SET_ITEM(item, 3, v);
        if ((v = PyLong_FromUnsignedLong(PyThread_get_thread_ident())) == NULL)
            goto fail;
        PyTuple_SET_ITEM(item, 4, v);
        PyTuple_SET_ITEM(item, 5, step); /* the reference moves into the tuple */
        step = NULL;
        /* ticked once the span is made: a failure to make it is not a span let go */
        res = PyObject_CallNoArgs(tick);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
        res = PyObject_CallOneArg(append, item);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
        Py_DECREF(item);
        Py_DECREF(recorder);
        Py_DECREF(tick);
        Py_DECREF(append);
        Py_RETURN_FALSE;
    fail:
        Py_XDECREF(step);
        Py_XDECREF(item);
        Py_DECREF(recorder);
        Py_DECREF(tick);
        Py_DECREF(append);
        swallow_error();
        Py_RETURN_FALSE;
    }
    PyObject *end_obj = PyLong_FromLongLong(end);
    if (end_obj == NULL) {
        swallow_error();
        Py_RETURN_FALSE;
    }
    PyObject *res = PyObject_CallMethodObjArgs((PyObject *)self, str_exit_slow, exc_type, end_obj,
                                               NULL);
    Py_DECREF(end_obj);
    if (res == NULL)
        swallow_error();
    else
        Py_DECREF(res);
    Py_RETURN_FALSE;
}

static PyObject *
Phase_get_start(PhaseObject *self, void *Py_UNUSED(closure))
{
    if (!self->started)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(self->start);
}

static int
Phase_set_start(PhaseObject *self, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL || value == Py_None) {
        self->started = 0;
        return 0;
    }
    long long start = PyLong_AsLongLong(value);
    if (start == -1 && PyErr_Occurred())
        return -1;
    self->start = start;
    self->started = 1;
    return 0;
}

/* `attrs` and `_gpu`: an object field that reads None when unset and is unset by None;
   the closure is the field's offset in PhaseObject */
static PyObject *
Phase_get_optional(PhaseObject *self, void *closure)
{
    PyObject *value = *(PyObject **)((char *)self + (Py_ssize_t)closure);
    value = value != NULL ? value : Py_None;
    Py_INCREF(value);
    return value;
}

static int
Phase_set_optional(PhaseObject *self, PyObject *value, void *closure)
{
    PyObject **field = (PyObject **)((char *)self + (Py_ssize_t)closure);
    if (value == Py_None)
        value = NULL;
    Py_XINCREF(value);
    Py_XSETREF(*field, value);
    return 0;
}

static PyMemberDef Phase_members[] = {
    {"name", T_OBJECT, offsetof(PhaseObject, name), 0, "The phase's name, as given."},
    {NULL},
};

static PyGetSetDef Phase_getset[] = {
    {"_start", (getter)Phase_get_start, (setter)Phase_set_start,
     "Monotonic ns when entered; None when not recording.", NULL},
    {"attrs", (getter)Phase_get_optional, (setter)Phase_set_optional,
     "The span's attributes (None: none).", (void *)offsetof(PhaseObject, attrs)},
    {"_gpu", (getter)Phase_get_optional, (setter)Phase_set_optional,
     "The CUDA event pair of a CUDA-timed span, or None.", (void *)offsetof(PhaseObject, gpu)},
    {NULL},
};

static PyMethodDef Phase_methods[] = {
    {"__enter__", (PyCFunction)Phase_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Phase_exit, METH_FASTCALL, NULL},
    {NULL},
};

static PyTypeObject PhaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gpuprof._cphase.PhaseBase",
    .tp_basicsize = sizeof(PhaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The C part of gpuprof.phase (see gpuprof/hooks.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Phase_init,
    .tp_dealloc = (destructor)Phase_dealloc,
    .tp_traverse = (traverseproc)Phase_traverse,
    .tp_clear = (inquiry)Phase_clear,
    .tp_methods = Phase_methods,
    .tp_members = Phase_members,
    .tp_getset = Phase_getset,
};

static PyObject *
set_fast(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *recorder, *tick, *append;
    int outside;
    if (!PyArg_ParseTuple(args, "OOOp", &recorder, &tick, &append, &outside))
        return NULL;
    if (recorder == Py_None) {
        Py_CLEAR(fast_recorder);
        Py_CLEAR(fast_tick);
        Py_CLEAR(fast_append);
    }
    else {
        /* the callables first: a recorder is never visible without them */
        Py_INCREF(tick);
        Py_XSETREF(fast_tick, tick);
        Py_INCREF(append);
        Py_XSETREF(fast_append, append);
        Py_INCREF(recorder);
        Py_XSETREF(fast_recorder, recorder);
    }
    outside_run = outside;
    Py_RETURN_NONE;
}

static PyObject *
set_disable(PyObject *Py_UNUSED(module), PyObject *callback)
{
    Py_INCREF(callback);
    Py_XSETREF(disable_cb, callback);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"set_fast", set_fast, METH_VARARGS,
     "set_fast(recorder or None, tick, append, outside_run): the fast path's state."},
    {"set_disable", set_disable, METH_O, "set_disable(callback): called with an internal error."},
    {NULL},
};

static struct PyModuleDef cphase_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpuprof._cphase",
    .m_doc = "The hot path of gpuprof.phase in C (optional; see gpuprof/hooks.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__cphase(void)
{
    str_step = PyUnicode_InternFromString("step");
    str_name = PyUnicode_InternFromString("name");
    str_enter_slow = PyUnicode_InternFromString("_enter_slow");
    str_exit_slow = PyUnicode_InternFromString("_exit_slow");
    if (str_step == NULL || str_name == NULL || str_enter_slow == NULL || str_exit_slow == NULL)
        return NULL;
    if (PyType_Ready(&PhaseType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&cphase_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&PhaseType);
    if (PyModule_AddObject(module, "PhaseBase", (PyObject *)&PhaseType) < 0) {
        Py_DECREF(&PhaseType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
