/* One thread's CPU segments (dpro.importers.kineto.segments: cpu_segments' visit and
 * _cut), in C, for the common ops.
 *
 * ``visit`` walks a thread's event tree as the Python one does: annotations and
 * ProfilerStep spans give context (category, layer), python frames are transparent, and
 * each outermost op is cut at its emission points.  An op whose subtree issues no
 * collective (no ``c10d::`` issue; a third of the ops have no children at all) is cut
 * here: the same points (kernel launches, blocking syncs), the same stable sort by time,
 * the same float comparisons, so the same Segs.  Any other op, a gloo execution recorded
 * as an annotation, a ProfilerStep-like name, an odd correlation id, is handed to the
 * Python functions (``_cut``, ...), which stay the reference and the fallback
 * (tests/test_kineto_segments_c.py compares the two on every corpus set).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

static PyObject *s_name, *s_cat, *s_ts, *s_end, *s_args, *s_children, *s_dev, *s_thread, *s_seq, *s_corr,
    *s_user_annotation, *s_python_function, *s_cuda_runtime, *s_cuda_driver, *s_c10d, *s_c10d_wait, *s_c10d_mb,
    *s_step_prefix, *s_gloo, *s_backward, *s_autograd, *s_reducer, *s_bw, *s_empty, *s_comm, *s_seqs, *s_dur, *s_kwnames, *minus_one;

/* How to make a Seg without running its dataclass __init__ (a Python function, most of the
 * cost of a segment): per field, in order, its slot descriptor, default and default factory
 * (segments._seg_spec); the object is allocated and every slot set, as __init__ sets them. */
enum { F_DEV, F_NAME, F_TS, F_END, F_CAT, F_LAUNCHES = 6, F_SYNC = 8, F_LAYER = 16, F_SEQS = 18, N_FIELDS = 22 };

typedef struct {
    PyObject *tid, *segs, *comm;
    PyTypeObject *seg_type;
    PyObject *spec; /* tuple of (descriptor, default, factory or None), one per field */
    /* from Python: Seg, _cut, gloo_seg(x, tid), context_cat(name), step_match(name), LAYER_PREFIX, SYNC_CALLS */
    PyObject *seg_cls, *py_cut, *gloo_seg, *context_cat, *step_match, *layer_prefix, *sync_calls;
} Ctx;

/* x.attr (a new reference) */
static inline PyObject *get(PyObject *x, PyObject *name) { return PyObject_GetAttr(x, name); }

/* args.get(key) for an event's args (a dict or an empty mapping): borrowed or NULL (no error when absent) */
static PyObject *arg(PyObject *args, PyObject *key, int *err) {
    *err = 0;
    if (PyDict_Check(args)) {
        PyObject *v = PyDict_GetItemWithError(args, key);
        if (!v && PyErr_Occurred()) *err = 1;
        return v;
    }
    Py_ssize_t n = PyObject_Length(args);
    if (n < 0) {
        *err = 1;
        return NULL;
    }
    if (n == 0) return NULL;
    *err = 2; /* a non-empty mapping that is not a dict: the Python path */
    return NULL;
}

static int startswith(PyObject *s, PyObject *prefix) {
    Py_ssize_t pl = PyUnicode_GET_LENGTH(prefix);
    if (pl > PyUnicode_GET_LENGTH(s)) return 0;
    return (int)PyUnicode_Tailmatch(s, prefix, 0, pl, -1);
}

/* segments.is_issue */
static int is_issue(PyObject *name) {
    int r = startswith(name, s_c10d);
    if (r <= 0) return r;
    r = startswith(name, s_c10d_wait);
    if (r) return r < 0 ? r : 0;
    r = startswith(name, s_c10d_mb);
    if (r) return r < 0 ? r : 0;
    return 1;
}

typedef struct {
    double t;
    int kind; /* 0 sync_start, 1 sync_end, 2 launch */
    Py_ssize_t order;
    PyObject *payload; /* borrowed: the sync kind (str) or the correlation id (int) */
} Point;

typedef struct {
    Point *p;
    Py_ssize_t n, cap;
    PyObject *seqs; /* list */
    PyObject *keep; /* list: references the points borrow */
} Walk;

static int push(Walk *w, double t, int kind, PyObject *payload) {
    if (w->n == w->cap) {
        Py_ssize_t cap = w->cap ? 2 * w->cap : 16;
        Point *p = realloc(w->p, (size_t)cap * sizeof(Point));
        if (!p) {
            PyErr_NoMemory();
            return -1;
        }
        w->p = p;
        w->cap = cap;
    }
    w->p[w->n] = (Point){t, kind, w->n, payload};
    w->n++;
    return 0;
}

static int keep(Walk *w, PyObject *o) { return PyList_Append(w->keep, o); }

static int as_double(PyObject *o, double *d) {
    if (!PyFloat_CheckExact(o)) return 0;
    *d = PyFloat_AS_DOUBLE(o);
    return 1;
}

/* _cut's walk(x, None) over ``children``: 1 done, 0 not plain (the Python path), -1 error */
static int walk(Ctx *c, Walk *w, PyObject *children) {
    if (!PyList_Check(children)) return 0;
    if (Py_EnterRecursiveCall(" in the Kineto segment walk")) return -1;
    int rc = 1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(children) && rc == 1; k++) {
        PyObject *ch = PyList_GET_ITEM(children, k);
        PyObject *name = get(ch, s_name), *cat = name ? get(ch, s_cat) : NULL, *args = cat ? get(ch, s_args) : NULL;
        if (!args) {
            rc = -1;
        } else if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(cat)) {
            rc = 0;
        } else {
            int err;
            PyObject *sq = arg(args, s_seq, &err);
            if (err) {
                rc = err == 1 ? -1 : 0;
            } else {
                if (sq && PyLong_Check(sq) && (PyList_Append(w->seqs, sq) < 0)) rc = -1;
                if (rc == 1 && (PyUnicode_Compare(cat, s_cuda_runtime) == 0 || PyUnicode_Compare(cat, s_cuda_driver) == 0)) {
                    PyObject *kind = PyDict_GetItemWithError(c->sync_calls, name);
                    double ts, end;
                    if (!kind && PyErr_Occurred()) {
                        rc = -1;
                    } else if (kind && PyObject_IsTrue(kind)) {
                        PyObject *ots = get(ch, s_ts), *oend = ots ? get(ch, s_end) : NULL;
                        if (!oend) rc = -1;
                        else if (!as_double(ots, &ts) || !as_double(oend, &end)) rc = 0;
                        else if (keep(w, kind) < 0 || push(w, ts, 0, kind) < 0 || push(w, end, 1, kind) < 0) rc = -1;
                        Py_XDECREF(ots);
                        Py_XDECREF(oend);
                    } else {
                        PyObject *corr = arg(args, s_corr, &err);
                        if (err) {
                            rc = err == 1 ? -1 : 0;
                        } else if (corr) {
                            PyObject *oend = get(ch, s_end);
                            if (!oend) rc = -1;
                            else if (!PyLong_CheckExact(corr) || !as_double(oend, &end)) rc = 0; /* int(): Python */
                            else if (keep(w, corr) < 0 || push(w, end, 2, corr) < 0) rc = -1;
                            Py_XDECREF(oend);
                        }
                    }
                } else if (rc == 1) {
                    int issue = is_issue(name);
                    if (issue) {
                        rc = issue < 0 ? -1 : 0;
                    } else {
                        PyObject *grand = get(ch, s_children);
                        if (!grand) rc = -1;
                        else rc = walk(c, w, grand);
                        Py_XDECREF(grand);
                    }
                }
            }
        }
        Py_XDECREF(name);
        Py_XDECREF(cat);
        Py_XDECREF(args);
    }
    Py_LeaveRecursiveCall();
    return rc;
}

static int cmp_point(const void *a, const void *b) {
    const Point *x = a, *y = b;
    if (x->t < y->t) return -1;
    if (x->t > y->t) return 1;
    return (x->order > y->order) - (x->order < y->order); /* sorted() is stable */
}

/* type(*given) with the other fields' defaults (``given[k]`` NULL: field k's default), for
 * a slotted dataclass of ``spec`` (see Ctx.spec): as its __init__ sets them */
static PyObject *make_obj(PyTypeObject *type, PyObject *spec, PyObject **given) {
    PyObject *seg = type->tp_alloc(type, 0);
    if (!seg) return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(spec); k++) {
        PyObject *f = PyTuple_GET_ITEM(spec, k), *descr = PyTuple_GET_ITEM(f, 0), *v;
        if (given[k]) v = Py_NewRef(given[k]);
        else if (PyTuple_GET_ITEM(f, 2) != Py_None) v = PyObject_CallNoArgs(PyTuple_GET_ITEM(f, 2));
        else v = Py_NewRef(PyTuple_GET_ITEM(f, 1));
        if (!v || Py_TYPE(descr)->tp_descr_set(descr, seg, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(seg);
            return NULL;
        }
        Py_DECREF(v);
    }
    return seg;
}

/* Seg(dev, name, ts, end, cat, launches=, sync=, layer=) appended to ``out`` */
static int emit(Ctx *c, PyObject *out, PyObject *dev, PyObject *name, double ts, double end, PyObject *cat,
                PyObject *launches, PyObject *sync, PyObject *layer) {
    PyObject *ots = PyFloat_FromDouble(ts), *oend = PyFloat_FromDouble(end);
    PyObject *seg = NULL;
    if (ots && oend) {
        PyObject *given[N_FIELDS] = {0};
        given[F_DEV] = dev, given[F_NAME] = name, given[F_TS] = ots, given[F_END] = oend, given[F_CAT] = cat;
        given[F_LAUNCHES] = launches, given[F_SYNC] = sync, given[F_LAYER] = layer;
        seg = make_obj(c->seg_type, c->spec, given);
    }
    Py_XDECREF(ots);
    Py_XDECREF(oend);
    if (!seg) return -1;
    int r = PyList_Append(out, seg);
    Py_DECREF(seg);
    return r;
}

/* _cut(op, dev, cat, layer) for a plain op: the list of Segs, Py_None when not plain, NULL on error */
static PyObject *cut_plain(Ctx *c, PyObject *op, PyObject *name, PyObject *opcat, PyObject *dev, PyObject *cat,
                           PyObject *layer) {
    int runtime = PyUnicode_Compare(opcat, s_cuda_runtime) == 0 || PyUnicode_Compare(opcat, s_cuda_driver) == 0;
    int issue = is_issue(name);
    if (issue < 0) return NULL;
    if (issue) Py_RETURN_NONE; /* a collective's issue (or a runtime call named like one): Python */
    PyObject *ots = get(op, s_ts), *oend = ots ? get(op, s_end) : NULL, *args = oend ? get(op, s_args) : NULL;
    PyObject *result = NULL, *children = NULL, *segs = NULL;
    Walk w = {0};
    double op_ts, op_end;
    if (!args) goto done;
    if (!as_double(ots, &op_ts) || !as_double(oend, &op_end)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (!(w.seqs = PyList_New(0)) || !(w.keep = PyList_New(0))) goto done;
    if (runtime) {
        children = PyList_New(1);
        if (!children) goto done;
        Py_INCREF(op);
        PyList_SET_ITEM(children, 0, op);
    } else if (!(children = get(op, s_children))) {
        goto done;
    }
    int rc = walk(c, &w, children);
    if (rc < 0) goto done;
    if (rc == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    int err;
    PyObject *own = arg(args, s_seq, &err);
    if (err) {
        if (err == 2) result = Py_NewRef(Py_None);
        goto done;
    }
    qsort(w.p, (size_t)w.n, sizeof(Point), cmp_point);
    if (!(segs = PyList_New(0))) goto done;
    /* the current segment: [cur_ts, ...), its launches and sync kind */
    double cur_ts = op_ts;
    PyObject *launches = PyList_New(0), *sync = Py_NewRef(Py_None);
    if (!launches) goto done_cur;
    for (Py_ssize_t k = 0; k < w.n; k++) {
        Point *p = &w.p[k];
        double t = p->t;
        if (cur_ts > t) t = cur_ts; /* max(t, cur.ts): t unless cur.ts is larger */
        if (op_end < t) t = op_end; /* min(., op.end) */
        if (p->kind == 0) { /* sync_start */
            if (t > cur_ts || PyList_GET_SIZE(launches)) {
                if (emit(c, segs, dev, name, cur_ts, t, cat, launches, sync, layer) < 0) goto done_cur;
            }
            Py_DECREF(launches);
            Py_DECREF(sync);
            sync = PyObject_Str(p->payload);
            launches = PyList_New(0);
            if (!sync || !launches) goto done_cur;
            cur_ts = t;
            continue;
        }
        if (p->kind == 2 && PyList_Append(launches, p->payload) < 0) goto done_cur;
        if (p->kind == 1 || (p->kind == 2 && t > cur_ts)) {
            if (emit(c, segs, dev, name, cur_ts, t, cat, launches, sync, layer) < 0) goto done_cur;
            Py_DECREF(launches);
            Py_DECREF(sync);
            sync = Py_NewRef(Py_None);
            launches = PyList_New(0);
            if (!launches) goto done_cur;
            cur_ts = t;
        }
    }
    if (op_end > cur_ts || PyList_GET_SIZE(segs) == 0 || PyList_GET_SIZE(launches)) {
        if (emit(c, segs, dev, name, cur_ts, op_end, cat, launches, sync, layer) < 0) goto done_cur;
    }
    /* names [i] when cut; the op's and its children's autograd sequence numbers on the first */
    Py_ssize_t n = PyList_GET_SIZE(segs);
    for (Py_ssize_t i = 0; n > 1 && i < n; i++) {
        PyObject *nm = PyUnicode_FromFormat("%U[%zd]", name, i);
        if (!nm || PyObject_SetAttr(PyList_GET_ITEM(segs, i), s_name, nm) < 0) {
            Py_XDECREF(nm);
            goto done_cur;
        }
        Py_DECREF(nm);
    }
    PyObject *seqs = PyList_New(0);
    if (!seqs) goto done_cur;
    if ((own && PyLong_Check(own) && PyList_Append(seqs, own) < 0) ||
        PyList_SetSlice(seqs, PyList_GET_SIZE(seqs), PyList_GET_SIZE(seqs), w.seqs) < 0 ||
        PyObject_SetAttr(PyList_GET_ITEM(segs, 0), s_seqs, seqs) < 0) {
        Py_DECREF(seqs);
        goto done_cur;
    }
    Py_DECREF(seqs);
    result = Py_NewRef(segs);
done_cur:
    Py_XDECREF(launches);
    Py_XDECREF(sync);
done:
    free(w.p);
    Py_XDECREF(w.seqs);
    Py_XDECREF(w.keep);
    Py_XDECREF(children);
    Py_XDECREF(segs);
    Py_XDECREF(ots);
    Py_XDECREF(oend);
    Py_XDECREF(args);
    return result;
}

/* segments._op_cat(name, ctx) */
static PyObject *op_cat(PyObject *name, PyObject *ctx) {
    if (PyObject_IsTrue(ctx)) return Py_NewRef(ctx);
    int r = PyUnicode_Find(name, s_backward, 0, PY_SSIZE_T_MAX, 1) >= 0;
    if (!r) r = startswith(name, s_autograd);
    if (!r) r = PyUnicode_Find(name, s_reducer, 0, PY_SSIZE_T_MAX, 1) >= 0;
    if (PyErr_Occurred()) return NULL;
    return Py_NewRef(r ? s_bw : s_empty);
}

/* the Segs of ``out`` (from _cut) to segs / comm, as visit does */
static int place(Ctx *c, PyObject *out) {
    PyObject *it = PyObject_GetIter(out), *sg;
    if (!it) return -1;
    while ((sg = PyIter_Next(it))) {
        PyObject *dev = get(sg, s_dev);
        int comm = dev ? PyObject_RichCompareBool(dev, s_comm, Py_EQ) : -1;
        Py_XDECREF(dev);
        if (comm < 0 || (comm && PyObject_SetAttr(sg, s_thread, c->tid) < 0) ||
            PyList_Append(comm ? c->comm : c->segs, sg) < 0) {
            Py_DECREF(sg);
            Py_DECREF(it);
            return -1;
        }
        Py_DECREF(sg);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static int visit(Ctx *c, PyObject *x, PyObject *ctx, PyObject *layer, PyObject *dev);

static int visit_children(Ctx *c, PyObject *x, PyObject *ctx, PyObject *layer, PyObject *dev) {
    PyObject *children = get(x, s_children);
    if (!children) return -1;
    PyObject *seq = PySequence_Fast(children, "children: a list");
    Py_DECREF(children);
    if (!seq) return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq) && rc == 0; k++)
        rc = visit(c, PySequence_Fast_GET_ITEM(seq, k), ctx, layer, dev);
    Py_DECREF(seq);
    return rc;
}

static int visit(Ctx *c, PyObject *x, PyObject *ctx, PyObject *layer, PyObject *dev) {
    if (Py_EnterRecursiveCall(" in the Kineto thread visit")) return -1;
    int rc = -1;
    PyObject *name = get(x, s_name), *cat = name ? get(x, s_cat) : NULL, *inner = NULL, *newlayer = NULL;
    if (!cat) goto done;
    if (!PyUnicode_CheckExact(name) || !PyUnicode_CheckExact(cat)) {
        PyErr_SetString(PyExc_TypeError, "visit: an event name or category that is not a str");
        goto done;
    }
    int annotation = PyUnicode_Compare(cat, s_user_annotation) == 0;
    if (!annotation) {
        int st = startswith(name, s_step_prefix);
        if (st < 0) goto done;
        if (st) { /* _STEP_RE.match(x.name): the regex itself */
            PyObject *m = PyObject_CallOneArg(c->step_match, name);
            if (!m) goto done;
            annotation = m != Py_None;
            Py_DECREF(m);
        }
    }
    if (annotation) {
        int g = startswith(name, s_gloo);
        if (g < 0) goto done;
        if (g) {
            PyObject *sg = PyObject_CallFunctionObjArgs(c->gloo_seg, x, c->tid, NULL);
            if (!sg) goto done;
            rc = PyList_Append(c->comm, sg);
            Py_DECREF(sg);
            goto done;
        }
        if (PyObject_IsTrue(ctx)) {
            inner = Py_NewRef(ctx);
        } else if (!(inner = PyObject_CallOneArg(c->context_cat, name))) {
            goto done;
        }
        int lp = startswith(name, c->layer_prefix);
        if (lp < 0) goto done;
        if (lp) {
            newlayer = PyUnicode_Substring(name, PyUnicode_GET_LENGTH(c->layer_prefix), PyUnicode_GET_LENGTH(name));
            if (!newlayer) goto done;
        }
        rc = visit_children(c, x, inner, newlayer ? newlayer : layer, dev);
        goto done;
    }
    if (PyUnicode_Compare(cat, s_python_function) == 0) {
        rc = visit_children(c, x, ctx, layer, dev);
        goto done;
    }
    PyObject *opc = op_cat(name, ctx);
    if (!opc) goto done;
    PyObject *out = cut_plain(c, x, name, cat, dev, opc, layer);
    if (out == Py_None) {
        Py_DECREF(out);
        out = PyObject_CallFunctionObjArgs(c->py_cut, x, dev, opc, layer, NULL);
    }
    Py_DECREF(opc);
    if (!out) goto done;
    rc = place(c, out);
    Py_DECREF(out);
done:
    Py_XDECREF(name);
    Py_XDECREF(cat);
    Py_XDECREF(inner);
    Py_XDECREF(newlayer);
    Py_LeaveRecursiveCall();
    return rc;
}

/* visit_thread(roots, tid, dev, segs, comm, Seg, seg_spec, _cut, gloo_seg, context_cat, step_match, LAYER_PREFIX,
 *              SYNC_CALLS) */
static PyObject *visit_thread(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "visit_thread: expected 13 arguments");
        return NULL;
    }
    Ctx c = {argv[1], argv[3], argv[4], (PyTypeObject *)argv[5], argv[6], argv[5], argv[7], argv[8], argv[9],
             argv[10], argv[11], argv[12]};
    PyObject *roots = argv[0], *dev = argv[2];
    int spec_ok = PyTuple_Check(c.spec) && PyTuple_GET_SIZE(c.spec) == N_FIELDS;
    for (Py_ssize_t k = 0; spec_ok && k < N_FIELDS; k++) {
        PyObject *f = PyTuple_GET_ITEM(c.spec, k);
        spec_ok = PyTuple_Check(f) && PyTuple_GET_SIZE(f) == 3 && Py_TYPE(PyTuple_GET_ITEM(f, 0))->tp_descr_set;
    }
    if (!PyType_Check(argv[5]) || !spec_ok || !PyList_Check(roots) || !PyList_Check(c.segs) || !PyList_Check(c.comm) ||
        !PyUnicode_Check(c.layer_prefix) || !PyDict_Check(c.sync_calls)) {
        PyErr_SetString(PyExc_TypeError, "visit_thread: bad argument types");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(roots); k++)
        if (visit(&c, PyList_GET_ITEM(roots, k), s_empty, Py_None, dev) < 0) return NULL;
    Py_RETURN_NONE;
}

static int spec_ok(PyObject *type, PyObject *spec, Py_ssize_t n) {
    if (!PyType_Check(type) || !PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != n) return 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *f = PyTuple_GET_ITEM(spec, k);
        if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) != 3 || !Py_TYPE(PyTuple_GET_ITEM(f, 0))->tp_descr_set) return 0;
    }
    return 1;
}

/* make_evs(kevents, _Ev, ev_spec, NO_ARGS): [_Ev(e.name, e.cat or "", e.ts, e.ts + e.dur, e.args or NO_ARGS)] */
static PyObject *make_evs(PyObject *mod, PyObject *const *argv, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_Check(argv[0]) || !spec_ok(argv[1], argv[2], 6)) {
        PyErr_SetString(PyExc_TypeError, "make_evs(kevents, _Ev, ev_spec, NO_ARGS)");
        return NULL;
    }
    PyObject *evs = argv[0], *no_args = argv[3];
    Py_ssize_t n = PyList_GET_SIZE(evs);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *e = PyList_GET_ITEM(evs, k), *ev = NULL;
        PyObject *name = get(e, s_name), *cat = name ? get(e, s_cat) : NULL, *ts = cat ? get(e, s_ts) : NULL,
                 *dur = ts ? get(e, s_dur) : NULL, *args = dur ? get(e, s_args) : NULL, *end = NULL;
        if (args) {
            int c_true = PyObject_IsTrue(cat), a_true = c_true < 0 ? -1 : PyObject_IsTrue(args);
            if (a_true >= 0 && (end = PyNumber_Add(ts, dur))) {
                PyObject *given[6] = {name, c_true ? cat : s_empty, ts, end, a_true ? args : no_args, NULL};
                ev = make_obj((PyTypeObject *)argv[1], argv[2], given);
            }
        }
        Py_XDECREF(name);
        Py_XDECREF(cat);
        Py_XDECREF(ts);
        Py_XDECREF(dur);
        Py_XDECREF(args);
        Py_XDECREF(end);
        if (!ev) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, ev);
    }
    return out;
}

typedef struct {
    double ts, end;
    Py_ssize_t i;
} Item;

static int cmp_item(const void *a, const void *b) {
    const Item *x = a, *y = b;
    if (x->ts < y->ts) return -1;
    if (x->ts > y->ts) return 1;
    if (-x->end < -y->end) return -1; /* the key (ts, -end), as Python compares it */
    if (-x->end > -y->end) return 1;
    return (x->i > y->i) - (x->i < y->i); /* list.sort is stable */
}

/* nest(items): items sorted by (ts, -end) and nested by time (segments._build_trees); the roots */
static PyObject *nest(PyObject *mod, PyObject *items) {
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "nest(items): a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Item *it = malloc((size_t)(n ? n : 1) * sizeof(Item));
    Py_ssize_t *stack = malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    PyObject *roots = NULL;
    if (!it || !stack) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = PyList_GET_ITEM(items, k), *ts = get(x, s_ts), *end = ts ? get(x, s_end) : NULL;
        int ok = end && PyFloat_CheckExact(ts) && PyFloat_CheckExact(end);
        if (ok) it[k] = (Item){PyFloat_AS_DOUBLE(ts), PyFloat_AS_DOUBLE(end), k};
        Py_XDECREF(ts);
        Py_XDECREF(end);
        if (!ok) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "nest: an event time that is not a float");
            goto done;
        }
    }
    qsort(it, (size_t)n, sizeof(Item), cmp_item);
    if (!(roots = PyList_New(0))) goto done;
    Py_ssize_t top = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        while (top && it[k].ts >= it[stack[top - 1]].end) top--;
        PyObject *x = PyList_GET_ITEM(items, it[k].i), *into = roots;
        PyObject *children = top ? get(PyList_GET_ITEM(items, it[stack[top - 1]].i), s_children) : NULL;
        if (top && !children) goto fail;
        if (children) into = children;
        int r = PyList_Append(into, x);
        Py_XDECREF(children);
        if (r < 0) goto fail;
        stack[top++] = k;
    }
    goto done;
fail:
    Py_CLEAR(roots);
done:
    free(it);
    free(stack);
    return roots;
}

static PyMethodDef methods[] = {
    {"make_evs", (PyCFunction)(void (*)(void))make_evs, METH_FASTCALL,
     "make_evs(kevents, _Ev, ev_spec, NO_ARGS): segments._build_trees' items, in C."},
    {"nest", (PyCFunction)nest, METH_O, "nest(items): segments._build_trees' sort and nesting, in C; the roots."},
    {"visit_thread", (PyCFunction)(void (*)(void))visit_thread, METH_FASTCALL,
     "visit_thread(roots, tid, dev, segs, comm, Seg, _cut, gloo_seg, context_cat, step_match, LAYER_PREFIX, "
     "SYNC_CALLS): segments.cpu_segments' visit of one thread, in C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_segments", "One thread's CPU segments in C.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__segments(void) {
#define S(var, text) \
    if (!(var = PyUnicode_InternFromString(text))) return NULL;
    S(s_name, "name") S(s_cat, "cat") S(s_ts, "ts") S(s_end, "end") S(s_args, "args") S(s_children, "children")
    S(s_dev, "dev") S(s_thread, "thread") S(s_seq, "Sequence number") S(s_corr, "correlation")
    S(s_user_annotation, "user_annotation") S(s_python_function, "python_function") S(s_cuda_runtime, "cuda_runtime")
    S(s_cuda_driver, "cuda_driver") S(s_c10d, "c10d::") S(s_c10d_wait, "c10d::wait")
    S(s_c10d_mb, "c10d::monitored_barrier") S(s_step_prefix, "ProfilerStep#") S(s_gloo, "gloo:")
    S(s_backward, "Backward") S(s_autograd, "autograd::engine") S(s_reducer, "reducer::") S(s_bw, "BW") S(s_empty, "")
    S(s_comm, "comm") S(s_seqs, "seqs") S(s_dur, "dur")
#undef S
    if (!(s_kwnames = Py_BuildValue("(sss)", "launches", "sync", "layer"))) return NULL;
    if (!(minus_one = PyLong_FromLong(-1))) return NULL;
    return PyModule_Create(&module);
}
