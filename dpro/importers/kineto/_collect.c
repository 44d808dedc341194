/* The Kineto reader's per-event loop (dpro.importers.kineto.read._Collector.add_python), in C.
 *
 * The same decisions on the same values: an event of the common shape (a dict whose
 * ts/dur are finite numbers in range, tid/pid an int or a string, args a dict or absent,
 * name and cat strings) is checked and kept here; any other event is handed to the
 * Python reference (``slow([event])``, with the collector's state written back first),
 * which raises its error or keeps it as it always did.  Equal args are shared through the
 * same dicts, strings through the same ``_strings`` table, in the same order of calls, so
 * the KEvents, python frames and counters are identical to the Python loop's
 * (tests/test_kineto_collect.py).  Built by setup.py with the replay core; optional: when
 * it is missing the Python loop runs (read.collector_engine() says which).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#define MAX_RAW_TIME 4611686018427387904.0 /* 2^62, read.MAX_RAW_TIME */
#define MAX_RAW_INT ((long long)1 << 62)

static PyObject *s_ph, *s_X, *s_ts, *s_dur, *s_tid, *s_args, *s_pid, *s_name, *s_cat, *s_python_function, *s_empty,
    *s_append, *s_index, *s_legacy, *s_has_op, *s_ts_attr, *s_dur_attr, *zero;

/* An exact int or float; ``*d`` its value as Python's float() gives it (ints: -> ``*i``,
 * ``*is_int``), 0 where it is neither (or an int beyond 64 bits: the Python path then). */
static int num(PyObject *x, double *d, long long *i, int *is_int) {
    if (PyFloat_CheckExact(x)) {
        *d = PyFloat_AS_DOUBLE(x);
        *is_int = 0;
        return 1;
    }
    if (PyLong_CheckExact(x)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        *i = v;
        *d = (double)v; /* nearest double, ties to even: PyLong_AsDouble's rounding */
        *is_int = 1;
        return 1;
    }
    return 0;
}

/* ``0 <= dur and abs(ts) + dur < MAX_RAW_TIME`` as Python evaluates it on these values */
static int in_range(double ts, long long its, int ts_int, double dur, long long idur, int dur_int) {
    if (ts_int && dur_int) { /* exact integer arithmetic, int vs float compare exact */
        if (idur < 0) return 0;
        if (its <= -MAX_RAW_INT || its >= MAX_RAW_INT || idur >= MAX_RAW_INT) return 0;
        long long a = its < 0 ? -its : its;
        return a + idur < MAX_RAW_INT;
    }
    /* a float among them: Python adds as doubles (an int converted first) */
    if (!(0 <= dur)) return 0;
    return fabs(ts) + dur < MAX_RAW_TIME;
}

/* names.startswith(prefixes) for a tuple of str prefixes */
static int starts_with_any(PyObject *s, PyObject *prefixes) {
    Py_ssize_t n = PyTuple_GET_SIZE(prefixes), len = PyUnicode_GET_LENGTH(s);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *p = PyTuple_GET_ITEM(prefixes, k);
        Py_ssize_t pl = PyUnicode_GET_LENGTH(p);
        if (pl <= len) {
            Py_ssize_t r = PyUnicode_Tailmatch(s, p, 0, pl, -1);
            if (r < 0) return -1;
            if (r) return 1;
        }
    }
    return 0;
}

typedef struct {
    PyObject *self, *events, *python, *cats, *strings, *same_args, *plans;
    PyObject *kevent, *new_frames, *args_plan, *dumps, *legacy_cats, *op_cats, *py_read, *kept, *slow;
    PyObject *slots; /* KEvent's six slot descriptors, in field order (read._kevent_slots) */
    long long legacy;
    int has_op;
} Ctx;

/* KEvent(*vals) without running its dataclass __init__ (a Python function, a third of the
 * loop's time): the object allocated and its six slots set, as __init__ sets them */
static PyObject *new_kevent(Ctx *c, PyObject **vals) {
    PyTypeObject *type = (PyTypeObject *)c->kevent;
    PyObject *ev = type->tp_alloc(type, 0);
    if (!ev) return NULL;
    for (Py_ssize_t k = 0; k < 6; k++) {
        PyObject *d = PyTuple_GET_ITEM(c->slots, k);
        if (Py_TYPE(d)->tp_descr_set(d, ev, vals[k]) < 0) {
            Py_DECREF(ev);
            return NULL;
        }
    }
    return ev;
}

/* 1 when ``x`` nests lists/objects ``limit`` deep or more (``[0]``: 1 deep), else 0; as
 * orjson.dumps fails on orjson.loads' output ("Recursion limit reached") */
static int nests(PyObject *x, int limit) {
    if (limit <= 0) return 1;
    if (PyList_CheckExact(x)) {
        if (limit == 1) return 1;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(x); k++) {
            PyObject *v = PyList_GET_ITEM(x, k);
            if ((PyList_CheckExact(v) || PyDict_CheckExact(v)) && nests(v, limit - 1)) return 1;
        }
        return 0;
    }
    if (PyDict_CheckExact(x)) {
        if (limit == 1) return 1;
        Py_ssize_t pos = 0;
        PyObject *key, *v;
        while (PyDict_Next(x, &pos, &key, &v))
            if ((PyList_CheckExact(v) || PyDict_CheckExact(v)) && nests(v, limit - 1)) return 1;
        return 0;
    }
    return 0;
}

/* too_deep(obj, limit): whether orjson-parsed ``obj`` nests ``limit`` levels or more */
static PyObject *too_deep(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_Check(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "too_deep(obj, limit)");
        return NULL;
    }
    long limit = PyLong_AsLong(argv[1]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(nests(argv[0], (int)(limit < 0 ? 0 : limit > 100000 ? 100000 : limit)));
}

static int sync_out(Ctx *c, Py_ssize_t index) {
    PyObject *v = PyLong_FromLongLong(c->legacy);
    if (!v) return -1;
    int r = PyObject_SetAttr(c->self, s_legacy, v);
    Py_DECREF(v);
    if (r < 0 || PyObject_SetAttr(c->self, s_has_op, c->has_op ? Py_True : Py_False) < 0) return -1;
    v = PyLong_FromSsize_t(index);
    if (!v) return -1;
    r = PyObject_SetAttr(c->self, s_index, v);
    Py_DECREF(v);
    return r;
}

static int sync_in(Ctx *c) {
    PyObject *v = PyObject_GetAttr(c->self, s_legacy);
    if (!v) return -1;
    c->legacy = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (c->legacy == -1 && PyErr_Occurred()) return -1;
    v = PyObject_GetAttr(c->self, s_has_op);
    if (!v) return -1;
    c->has_op = PyObject_IsTrue(v);
    Py_DECREF(v);
    return c->has_op < 0 ? -1 : 0;
}

/* the Python reference on one event, traceEvents[index] */
static int slow_one(Ctx *c, PyObject *e, Py_ssize_t index) {
    if (sync_out(c, index) < 0) return -1;
    PyObject *one = PyList_New(1);
    if (!one) return -1;
    Py_INCREF(e);
    PyList_SET_ITEM(one, 0, e);
    PyObject *r = PyObject_CallOneArg(c->slow, one);
    Py_DECREF(one);
    if (!r) return -1;
    Py_DECREF(r);
    return sync_in(c);
}

/* shared(x, x): the table's copy of x (a new reference) */
static PyObject *shared(Ctx *c, PyObject *x) {
    PyObject *r = PyDict_SetDefault(c->strings, x, x);
    Py_XINCREF(r);
    return r;
}

/* dict(zip(keys, vals)) */
static PyObject *zip_dict(PyObject *keys, PyObject *vals) {
    if (!PyTuple_Check(vals)) {
        PyObject *t = PySequence_Tuple(vals);
        if (!t) return NULL;
        PyObject *d = zip_dict(keys, t);
        Py_DECREF(t);
        return d;
    }
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys) < PyTuple_GET_SIZE(vals) ? PyTuple_GET_SIZE(keys) : PyTuple_GET_SIZE(vals);
    for (Py_ssize_t k = 0; k < n; k++)
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(keys, k), PyTuple_GET_ITEM(vals, k)) < 0) {
            Py_DECREF(d);
            return NULL;
        }
    return d;
}

/* the kept args of ``args`` (a non-empty dict): a new reference, or Py_None */
static PyObject *keep_args(Ctx *c, PyObject *args) {
    Py_ssize_t n = PyDict_GET_SIZE(args), pos = 0, k = 0;
    PyObject *names = PyTuple_New(n), *key, *val;
    if (!names) return NULL;
    while (PyDict_Next(args, &pos, &key, &val)) {
        if (k >= n) break;
        Py_INCREF(key);
        PyTuple_SET_ITEM(names, k++, key);
    }
    PyObject *plan = PyDict_GetItemWithError(c->plans, names);
    if (plan) {
        Py_INCREF(plan);
    } else {
        if (PyErr_Occurred() || !(plan = PyObject_CallOneArg(c->args_plan, names)) ||
            PyDict_SetItem(c->plans, names, plan) < 0) {
            Py_DECREF(names);
            Py_XDECREF(plan);
            return NULL;
        }
    }
    Py_DECREF(names);
    PyObject *out = NULL;
    if (!PyTuple_Check(plan) || PyTuple_GET_SIZE(plan) != 3) {
        PyErr_SetString(PyExc_TypeError, "args plan: expected a 3-tuple");
        goto done;
    }
    PyObject *keys = PyTuple_GET_ITEM(plan, 0), *get = PyTuple_GET_ITEM(plan, 1);
    int share = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 2));
    if (share < 0) goto done;
    if (keys == Py_None) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *vals = PyObject_CallOneArg(get, args);
    if (!vals) goto done;
    if (!share) {
        out = zip_dict(keys, vals);
        Py_DECREF(vals);
        goto done;
    }
    PyObject *enc = PyObject_CallOneArg(c->dumps, vals);
    PyObject *skey = enc ? PyTuple_Pack(2, keys, enc) : NULL;
    Py_XDECREF(enc);
    if (!skey) {
        Py_DECREF(vals);
        goto done;
    }
    PyObject *found = PyDict_GetItemWithError(c->same_args, skey);
    int truthy = found ? PyObject_IsTrue(found) : 0;
    if (truthy < 0 || (!found && PyErr_Occurred())) {
        Py_DECREF(vals);
        Py_DECREF(skey);
        goto done;
    }
    if (truthy) {
        out = Py_NewRef(found);
    } else {
        PyObject *d = zip_dict(keys, vals);
        if (d) {
            out = PyDict_SetDefault(c->same_args, skey, d);
            Py_XINCREF(out);
            Py_DECREF(d);
        }
    }
    Py_DECREF(vals);
    Py_DECREF(skey);
done:
    Py_DECREF(plan);
    return out;
}

/* a python_function frame that is not kept as an event: (ts, dur) to its thread's PyFrames */
static int add_frame(Ctx *c, PyObject *tid, PyObject *ts, PyObject *dur) {
    PyObject *f = PyDict_GetItemWithError(c->python, tid);
    if (f) {
        Py_INCREF(f);
    } else {
        if (PyErr_Occurred()) return -1;
        PyObject *first = PyLong_FromSsize_t(PyList_GET_SIZE(c->events));
        if (!first) return -1;
        f = PyObject_CallOneArg(c->new_frames, first);
        Py_DECREF(first);
        if (!f || PyDict_SetItem(c->python, tid, f) < 0) {
            Py_XDECREF(f);
            return -1;
        }
        if (!c->has_op && PySet_Add(c->cats, s_python_function) < 0) {
            Py_DECREF(f);
            return -1;
        }
    }
    int rc = -1;
    PyObject *a = PyObject_GetAttr(f, s_ts_attr), *b = a ? PyObject_GetAttr(f, s_dur_attr) : NULL;
    if (b) {
        PyObject *r = PyObject_CallMethodOneArg(a, s_append, ts);
        if (r) {
            Py_DECREF(r);
            r = PyObject_CallMethodOneArg(b, s_append, dur);
            if (r) {
                Py_DECREF(r);
                rc = 0;
            }
        }
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_DECREF(f);
    return rc;
}

/* an event of the common shape, checked: keep it */
static int keep_event(Ctx *c, PyObject *e, PyObject *name, PyObject *cat, PyObject *tid, PyObject *args, double ts,
                      double dur) {
    PyObject *scat = NULL, *kargs = NULL, *sname = NULL, *stid = NULL, *fts = NULL, *fdur = NULL, *ev = NULL;
    int rc = -1;
    if (cat) {
        PyObject *modern = PyDict_GetItemWithError(c->legacy_cats, cat);
        if (!modern && PyErr_Occurred()) goto done;
        if (modern) c->legacy++;
        if (!(scat = shared(c, modern ? modern : cat))) goto done;
    } else {
        scat = Py_NewRef(Py_None);
    }
    if (!c->has_op) {
        int has = PySequence_Contains(c->op_cats, scat);
        if (has < 0) goto done;
        c->has_op = has;
        PyObject *raw = PyDict_GetItemWithError(e, s_cat);
        if (!raw && PyErr_Occurred()) goto done;
        PyObject *str = PyObject_Str(raw ? raw : Py_None);
        if (!str) goto done;
        int r = PySet_Add(c->cats, str);
        Py_DECREF(str);
        if (r < 0) goto done;
    }
    if (args && PyDict_GET_SIZE(args)) {
        if (!(kargs = keep_args(c, args))) goto done;
    } else {
        kargs = Py_NewRef(Py_None);
    }
    if (!(sname = shared(c, name)) || !(stid = shared(c, tid)) || !(fts = PyFloat_FromDouble(ts)) ||
        !(fdur = PyFloat_FromDouble(dur)))
        goto done;
    PyObject *vals[6] = {sname, scat, fts, fdur, stid, kargs};
    if (!(ev = new_kevent(c, vals))) goto done;
    rc = PyList_Append(c->events, ev);
done:
    Py_XDECREF(scat);
    Py_XDECREF(kargs);
    Py_XDECREF(sname);
    Py_XDECREF(stid);
    Py_XDECREF(fts);
    Py_XDECREF(fdur);
    Py_XDECREF(ev);
    return rc;
}

static PyObject *attr(PyObject *o, const char *name) { return PyObject_GetAttrString(o, name); }

/* add(collector, batch, kevent, new_frames, args_plan, dumps, legacy_cats, op_cats, py_read, kept, slow, slots) */
static PyObject *collect_add(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "add: expected 12 arguments");
        return NULL;
    }
    Ctx c = {0};
    PyObject *batch = argv[1];
    c.self = argv[0];
    c.kevent = argv[2];
    c.new_frames = argv[3];
    c.args_plan = argv[4];
    c.dumps = argv[5];
    c.legacy_cats = argv[6];
    c.op_cats = argv[7];
    c.py_read = argv[8];
    c.kept = argv[9];
    c.slow = argv[10];
    c.slots = argv[11];
    int slots_ok = PyType_Check(c.kevent) && PyTuple_Check(c.slots) && PyTuple_GET_SIZE(c.slots) == 6;
    for (Py_ssize_t k = 0; slots_ok && k < 6; k++) slots_ok = Py_TYPE(PyTuple_GET_ITEM(c.slots, k))->tp_descr_set != NULL;
    if (!slots_ok || !PyList_Check(batch) || !PyDict_Check(c.legacy_cats) || !PyTuple_Check(c.py_read) ||
        !PyAnySet_Check(c.kept)) {
        PyErr_SetString(PyExc_TypeError, "add: bad argument types");
        return NULL;
    }
    PyObject *result = NULL, *index_obj = NULL;
    c.events = attr(c.self, "events");
    c.python = attr(c.self, "python");
    c.cats = attr(c.self, "cats");
    c.strings = attr(c.self, "_strings");
    c.same_args = attr(c.self, "_args");
    c.plans = attr(c.self, "_plans");
    if (!c.events || !c.python || !c.cats || !c.strings || !c.same_args || !c.plans) goto out;
    if (!PyList_Check(c.events) || !PyDict_Check(c.python) || !PyAnySet_Check(c.cats) || !PyDict_Check(c.strings) ||
        !PyDict_Check(c.same_args) || !PyDict_Check(c.plans)) {
        PyErr_SetString(PyExc_TypeError, "add: the collector's tables have unexpected types");
        goto out;
    }
    if (!(index_obj = PyObject_GetAttr(c.self, s_index))) goto out;
    Py_ssize_t base = PyLong_AsSsize_t(index_obj);
    if (base == -1 && PyErr_Occurred()) goto out;
    if (sync_in(&c) < 0) goto out;
    Py_ssize_t n = PyList_GET_SIZE(batch);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *e = PyList_GET_ITEM(batch, k);
        Py_ssize_t i = base + k;
        if (!PyDict_CheckExact(e)) continue;
        Py_INCREF(e); /* the slow path runs Python code */
        int rc = 0;
        PyObject *ph = PyDict_GetItemWithError(e, s_ph);
        if (!ph) {
            if (PyErr_Occurred()) rc = -1;
            goto next; /* None != "X" */
        }
        if (!PyUnicode_CheckExact(ph)) {
            rc = slow_one(&c, e, i);
            goto next;
        }
        if (ph != s_X) {
            int eq = PyUnicode_Compare(ph, s_X);
            if (eq == -1 && PyErr_Occurred()) {
                rc = -1;
                goto next;
            }
            if (eq != 0) goto next;
        }
        PyObject *ts = PyDict_GetItemWithError(e, s_ts), *dur = PyDict_GetItemWithError(e, s_dur),
                 *tid = PyDict_GetItemWithError(e, s_tid), *args = PyDict_GetItemWithError(e, s_args),
                 *pid = PyDict_GetItemWithError(e, s_pid), *name = PyDict_GetItemWithError(e, s_name),
                 *cat = PyDict_GetItemWithError(e, s_cat);
        if (PyErr_Occurred()) {
            rc = -1;
            goto next;
        }
        double dts, ddur;
        long long its = 0, idur = 0;
        int ts_int = 0, dur_int = 1;
        if (!dur) {
            ddur = 0.0;
        }
        if (args == Py_None) args = NULL;
        if (cat == Py_None) cat = NULL;
        if (!name) name = s_empty;
        int fast = ts && num(ts, &dts, &its, &ts_int) && (!dur || num(dur, &ddur, &idur, &dur_int)) &&
                   in_range(dts, its, ts_int, ddur, idur, dur_int) &&
                   (tid == NULL || PyLong_CheckExact(tid) || PyUnicode_CheckExact(tid)) &&
                   (args == NULL || PyDict_CheckExact(args)) &&
                   (pid == NULL || PyLong_CheckExact(pid) || PyUnicode_CheckExact(pid)) && PyUnicode_CheckExact(name) &&
                   (cat == NULL || PyUnicode_CheckExact(cat));
        if (!fast) {
            rc = slow_one(&c, e, i);
            goto next;
        }
        if (!tid) tid = Py_None;
        /* a python_function frame the converter only reads as context */
        if (cat && PyUnicode_Compare(cat, s_python_function) == 0) {
            int read = starts_with_any(name, c.py_read);
            if (read < 0) {
                rc = -1;
                goto next;
            }
            int frame = !read;
            if (frame && args && PyDict_GET_SIZE(args)) {
                Py_ssize_t pos = 0;
                PyObject *key, *val;
                while (PyDict_Next(args, &pos, &key, &val)) {
                    int in = PySet_Contains(c.kept, key);
                    if (in < 0) {
                        rc = -1;
                        goto next;
                    }
                    if (in) {
                        frame = 0;
                        break;
                    }
                }
            }
            if (frame) {
                rc = add_frame(&c, tid, ts, dur ? dur : zero);
                goto next;
            }
        }
        rc = keep_event(&c, e, name, cat, tid, args, dts, ddur);
    next:
        Py_DECREF(e);
        if (rc < 0) { /* the state so far, as the Python loop leaves it; its error is raised */
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            if (sync_out(&c, i) < 0) PyErr_Clear();
            PyErr_Restore(et, ev, tb);
            goto out;
        }
    }
    if (sync_out(&c, base + n) < 0) goto out;
    result = Py_NewRef(Py_None);
out:
    Py_XDECREF(index_obj);
    Py_XDECREF(c.events);
    Py_XDECREF(c.python);
    Py_XDECREF(c.cats);
    Py_XDECREF(c.strings);
    Py_XDECREF(c.same_args);
    Py_XDECREF(c.plans);
    return result;
}

static PyMethodDef methods[] = {
    {"add", (PyCFunction)(void (*)(void))collect_add, METH_FASTCALL,
     "add(collector, batch, KEvent, new_frames, args_plan, dumps, LEGACY_CATS, OP_CATS, PY_NAMES_READ, KEPT_ARGS, "
     "slow, slots): read._Collector.add_python's loop in C."},
    {"too_deep", (PyCFunction)(void (*)(void))too_deep, METH_FASTCALL,
     "too_deep(obj, limit): whether orjson-parsed obj nests limit levels or more (jsonio.too_deep for such data)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_collect", "The Kineto reader's per-event loop in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__collect(void) {
#define S(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return NULL;
    S(s_ph, "ph") S(s_X, "X") S(s_ts, "ts") S(s_dur, "dur") S(s_tid, "tid") S(s_args, "args") S(s_pid, "pid")
    S(s_name, "name") S(s_cat, "cat") S(s_python_function, "python_function") S(s_empty, "")
    S(s_append, "append") S(s_index, "index") S(s_legacy, "legacy") S(s_has_op, "has_op") S(s_ts_attr, "ts")
    S(s_dur_attr, "dur")
#undef S
    if (!(zero = PyLong_FromLong(0))) return NULL;
    return PyModule_Create(&module);
}
