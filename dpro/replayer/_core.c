/* The compiled replay core: dpro.replayer.engine._simulate_reference, line by line, in C.
 *
 * The same rules, the same float operations in the same order (one IEEE double addition
 * per op, s + dur; everything else is comparisons), so the schedule is bit-identical to
 * the Python reference for every input without NaN (engine.py sends NaN input to the
 * reference).  Built with -ffp-contract=off and without -ffast-math (setup.py).
 *
 * No numpy C API: arrays come in through the buffer protocol (C-contiguous float64 /
 * int64), so one build works with numpy 1.x and 2.x.  The loop runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p, w) __builtin_prefetch((p), (w))
#else
#define PREFETCH(p, w) ((void)0)
#endif

typedef struct {
    double r; /* ready time */
    int64_t i; /* op (its prio is looked up on a tie) */
} QItem;

typedef struct {
    double c; /* candidate start */
    int64_t d; /* device */
} DItem;

/* (r, prio[i], i) < (r', prio[i'], i') as Python compares tuples of non-NaN floats and ints */
static inline int q_less(const QItem *a, const QItem *b, const double *prio) {
    if (a->r != b->r) return a->r < b->r;
    if (prio[a->i] != prio[b->i]) return prio[a->i] < prio[b->i];
    return a->i < b->i;
}

static inline int d_less(const DItem *a, const DItem *b) {
    return (a->c < b->c) | ((a->c == b->c) & (a->d < b->d)); /* no branch: the heap's choices are coin flips */
}

/* A device's queue of ready ops: a sorted run (ops almost always become ready in queue
 * order, so they are appended behind the last one) plus a heap of the few that do not.
 * The run lives in the device's slice of one pool (each op joins one queue once). */
typedef struct {
    QItem *run;
    int64_t head, tail;
    QItem *ovf; /* heap */
    int64_t nov, cap;
} Queue;

static inline int q_empty(const Queue *q) { return q->head == q->tail && q->nov == 0; }

/* the queue's first op (the queue is not empty) */
static inline const QItem *q_first(const Queue *q, const double *prio) {
    if (q->nov && (q->head == q->tail || q_less(&q->ovf[0], &q->run[q->head], prio))) return &q->ovf[0];
    return &q->run[q->head];
}

static inline int q_push(Queue *q, QItem x, const double *prio) {
    if (q->head == q->tail || q_less(&q->run[q->tail - 1], &x, prio)) {
        q->run[q->tail++] = x;
        return 0;
    }
    if (q->nov == q->cap) {
        int64_t cap = q->cap ? 2 * q->cap : 16;
        QItem *a = (QItem *)realloc(q->ovf, (size_t)cap * sizeof(QItem));
        if (!a) return -1;
        q->ovf = a;
        q->cap = cap;
    }
    QItem *h = q->ovf;
    int64_t k = q->nov++;
    while (k > 0) {
        int64_t parent = (k - 1) >> 1;
        if (!q_less(&x, &h[parent], prio)) break;
        h[k] = h[parent];
        k = parent;
    }
    h[k] = x;
    return 0;
}

static inline QItem q_pop(Queue *q, const double *prio) {
    if (!(q->nov && (q->head == q->tail || q_less(&q->ovf[0], &q->run[q->head], prio)))) return q->run[q->head++];
    QItem *h = q->ovf;
    QItem top = h[0];
    int64_t n = --q->nov;
    if (n > 0) {
        QItem x = h[n];
        int64_t k = 0;
        for (;;) {
            int64_t c = 2 * k + 1;
            if (c >= n) break;
            if (c + 1 < n && q_less(&h[c + 1], &h[c], prio)) c++;
            if (!q_less(&h[c], &x, prio)) break;
            h[k] = h[c];
            k = c;
        }
        h[k] = x;
    }
    return top;
}

typedef struct {
    DItem *a;
    int64_t size, cap;
} DHeap;

static int d_push(DHeap *h, DItem x) {
    if (h->size == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        DItem *a = (DItem *)realloc(h->a, (size_t)cap * sizeof(DItem));
        if (!a) return -1;
        h->a = a;
        h->cap = cap;
    }
    int64_t k = h->size++;
    while (k > 0) {
        int64_t parent = (k - 1) >> 1;
        if (!d_less(&x, &h->a[parent])) break;
        h->a[k] = h->a[parent];
        k = parent;
    }
    h->a[k] = x;
    return 0;
}

/* Pop the smallest entry and, if ``x`` is given, push it in the same pass (``heappushpop``
 * for an x that is not smaller than the smallest entry; heappop otherwise).  The hole left
 * at the root goes down to a leaf along the smaller children (branch-free choice), then x
 * goes up from there (Floyd; as heapq does): ~1 comparison per level.  Heap order of
 * equal entries does not matter: equal (c, d) pairs are interchangeable. */
static inline DItem d_pop(DHeap *h, const DItem *x) {
    DItem *a = h->a;
    DItem top = a[0];
    int64_t n = x ? h->size : --h->size;
    if (n == 0) return top;
    DItem last = x ? *x : a[n];
    int64_t k = 0, c;
    while ((c = 2 * k + 1) < n) {
        if (c + 1 < n) c += d_less(&a[c + 1], &a[c]);
        a[k] = a[c];
        k = c;
    }
    while (k > 0) {
        int64_t parent = (k - 1) >> 1;
        if (!d_less(&last, &a[parent])) break;
        a[k] = a[parent];
        k = parent;
    }
    a[k] = last;
    return top;
}

/* What the loop reads and writes about an op when one of its predecessors ends, in one
 * place (24 bytes) instead of four scattered arrays: the loop is bound by memory latency. */
typedef struct {
    double ready;
    int64_t binder;
    int32_t pending;
    int32_t dev;
} Op;

/* The simulation; returns the number of ops run (n unless a cycle), -1 if out of memory,
 * -2 if a device with an empty queue came up (infinite times). */
static int64_t run(int64_t n, int64_t ndev, const double *dur, const int64_t *dev, const double *prio,
                   const int64_t *ptr, const int64_t *succ, const double *release, int64_t *binder_out,
                   double *start, double *end) {
    const double inf = INFINITY;
    int64_t done = -1;
    Op *op = NULL;
    QItem *pool = NULL;
    Queue *queue = NULL;
    int64_t *qoff = NULL, *last = NULL;
    double *clock = NULL, *key = NULL;
    DHeap heap = {NULL, 0, 0};

    op = (Op *)malloc(((size_t)n + 1) * sizeof(Op));
    pool = (QItem *)malloc((size_t)(n > 0 ? n : 1) * sizeof(QItem));
    qoff = (int64_t *)calloc((size_t)ndev + 1, sizeof(int64_t));
    queue = (Queue *)calloc((size_t)ndev + 1, sizeof(Queue));
    last = (int64_t *)malloc(((size_t)ndev + 1) * sizeof(int64_t));
    clock = (double *)malloc(((size_t)ndev + 1) * sizeof(double));
    key = (double *)malloc(((size_t)ndev + 1) * sizeof(double));
    if (!op || !pool || !qoff || !queue || !last || !clock || !key) goto out;
    for (int64_t i = 0; i < n; i++) {
        Op *o = &op[i];
        o->ready = release ? release[i] : 0.0;
        o->binder = -1;
        o->pending = 0;
        o->dev = (int32_t)dev[i];
        qoff[dev[i] + 1]++;
    }
    for (int64_t k = 0, m = ptr[n]; k < m; k++) op[succ[k]].pending++;
    /* device d's queue lives in pool[qoff[d] .. qoff[d+1]) (it never holds more than its ops) */
    for (int64_t d = 0; d < ndev; d++) qoff[d + 1] += qoff[d];
    for (int64_t d = 0; d < ndev; d++) {
        queue[d].run = pool + qoff[d];
        last[d] = -1;
        clock[d] = 0.0;
        key[d] = inf;
    }

    for (int64_t i = 0; i < n; i++) {
        if (op[i].pending == 0) {
            QItem x = {op[i].ready, i};
            if (q_push(&queue[op[i].dev], x, prio)) goto out;
        }
    }
    for (int64_t d = 0; d < ndev; d++) {
        if (!q_empty(&queue[d])) {
            key[d] = q_first(&queue[d], prio)->r;
            DItem x = {key[d], d};
            if (d_push(&heap, x)) goto out;
        }
    }

    done = 0;
    DItem back; /* the device that just stopped, going back into the heap */
    int has_back = 0;
    while (heap.size) {
        DItem top_item = d_pop(&heap, has_back ? &back : NULL);
        has_back = 0;
        int64_t d = top_item.d;
        if (top_item.c != key[d]) continue;
        Queue *q = &queue[d];
        if (q_empty(q)) {
            /* only with infinite times (an (inf, d) entry outlives its queue): the Python
             * reference fails here too; engine.py lets it say how */
            done = -2;
            goto out;
        }
        double c = clock[d];
        double top = heap.size ? heap.a[0].c : inf;
        for (;;) {
            QItem it = q_pop(q, prio);
            int64_t i = it.i;
            Op *oi = &op[i];
            double r = it.r, s;
            if (c >= r) {
                s = c;
                oi->binder = last[d];
            } else {
                s = r;
            }
            double e = s + dur[i];
            start[i] = s;
            c = e;
            last[d] = i;
            done++;
            /* the loop waits on memory: ask for the successors' state, and for the next op
             * of this queue, before they are needed (~15% on benchmarks/replay_speed.py) */
            int64_t kbeg = ptr[i], kend = ptr[i + 1];
            for (int64_t k = kbeg; k < kend; k++) PREFETCH(&op[succ[k]], 1);
            if (q->head < q->tail) {
                int64_t nx = q->run[q->head].i;
                PREFETCH(&ptr[nx], 0);
                PREFETCH(&dur[nx], 0);
            }
            for (int64_t k = kbeg; k < kend; k++) {
                int64_t j = succ[k];
                Op *oj = &op[j];
                if (e > oj->ready || (oj->binder == -1 && e == oj->ready)) {
                    oj->ready = e;
                    oj->binder = i;
                }
                if (--oj->pending == 0) {
                    int64_t dj = oj->dev;
                    QItem x = {oj->ready, j};
                    if (q_push(&queue[dj], x, prio)) {
                        done = -1;
                        goto out;
                    }
                    if (dj != d) {
                        double cand = oj->ready > clock[dj] ? oj->ready : clock[dj];
                        if (cand < key[dj]) {
                            key[dj] = cand;
                            DItem y = {cand, dj};
                            if (d_push(&heap, y)) {
                                done = -1;
                                goto out;
                            }
                            if (cand < top) top = cand;
                        }
                    }
                }
            }
            if (q_empty(q)) {
                key[d] = inf;
                break;
            }
            double r0 = q_first(q, prio)->r;
            double nxt = r0 > c ? r0 : c;
            if (nxt > top) {
                /* (nxt, d) goes back into the heap; it is larger than the smallest entry
                 * (top), so pushing it and popping the smallest is one pass (d_pop) */
                key[d] = nxt;
                back.c = nxt;
                back.d = d;
                has_back = 1;
                break;
            }
        }
        clock[d] = c;
    }
    for (int64_t i = 0; i < n; i++) {
        binder_out[i] = op[i].binder;
        end[i] = start[i] + dur[i]; /* the same addition as in the loop: the same double */
    }
out:
    free(op);
    free(pool);
    free(qoff);
    if (queue)
        for (int64_t d = 0; d < ndev; d++) free(queue[d].ovf);
    free(queue);
    free(last);
    free(clock);
    free(key);
    free(heap.a);
    return done;
}

static int check_buf(Py_buffer *b, const char *name, Py_ssize_t count, Py_ssize_t itemsize) {
    if (b->len != count * itemsize) {
        PyErr_Format(PyExc_ValueError, "_core.simulate: %s has %zd bytes, expected %zd", name, b->len,
                     count * itemsize);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(simulate_doc,
             "simulate(ndev, dur, dev, prio, ptr, succ, release, binder, start, end) -> ops run\n\n"
             "C-contiguous buffers: dur, prio, release float64[n] (release may be None: all 0);\n"
             "dev int64[n] (each in 0..ndev-1);\n"
             "ptr int64[n+1]; succ int64[ptr[n]] (each in 0..n-1); binder int64[n], start, end float64[n]\n"
             "are written. Returns the number of ops that ran (< n: a cycle).");

static PyObject *py_simulate(PyObject *self, PyObject *args) {
    Py_ssize_t ndev;
    Py_buffer dur, dev, prio, ptr, succ, binder, start, end;
    Py_buffer release = {0};
    PyObject *release_obj;
    if (!PyArg_ParseTuple(args, "ny*y*y*y*y*Ow*w*w*:simulate", &ndev, &dur, &dev, &prio, &ptr, &succ, &release_obj,
                          &binder, &start, &end))
        return NULL;
    Py_buffer *all[] = {&dur, &dev, &prio, &ptr, &succ, &binder, &start, &end};
    PyObject *result = NULL;
    int has_release = release_obj != Py_None;
    if (has_release && PyObject_GetBuffer(release_obj, &release, PyBUF_SIMPLE) < 0) {
        for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) PyBuffer_Release(all[k]);
        return NULL;
    }
    Py_ssize_t n = dur.len / 8;
    if (check_buf(&dur, "dur", n, 8) || check_buf(&dev, "dev", n, 8) || check_buf(&prio, "prio", n, 8) ||
        check_buf(&ptr, "ptr", n + 1, 8) || (has_release && check_buf(&release, "release", n, 8)) ||
        check_buf(&binder, "binder", n, 8) ||
        check_buf(&start, "start", n, 8) || check_buf(&end, "end", n, 8))
        goto done;
    const int64_t *devp = (const int64_t *)dev.buf, *ptrp = (const int64_t *)ptr.buf;
    const int64_t *succp = (const int64_t *)succ.buf;
    Py_ssize_t m = succ.len / 8;
    if (check_buf(&succ, "succ", m, 8)) goto done;
    /* indices are checked here, so the loop cannot read or write out of bounds */
    if (ndev < 0 || ptrp[0] != 0 || ptrp[n] != m) {
        PyErr_SetString(PyExc_ValueError, "_core.simulate: bad ndev or ptr");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (devp[i] < 0 || devp[i] >= ndev || ptrp[i] > ptrp[i + 1]) {
            PyErr_SetString(PyExc_ValueError, "_core.simulate: device index out of range or ptr not sorted");
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < m; k++) {
        if (succp[k] < 0 || succp[k] >= n) {
            PyErr_SetString(PyExc_ValueError, "_core.simulate: successor index out of range");
            goto done;
        }
    }
    int64_t ran;
    Py_BEGIN_ALLOW_THREADS
    ran = run(n, ndev, (const double *)dur.buf, devp, (const double *)prio.buf, ptrp, succp,
              has_release ? (const double *)release.buf : NULL, (int64_t *)binder.buf, (double *)start.buf, (double *)end.buf);
    Py_END_ALLOW_THREADS
    if (ran == -1)
        PyErr_NoMemory();
    else
        result = PyLong_FromLongLong(ran);
done:
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) PyBuffer_Release(all[k]);
    if (has_release) PyBuffer_Release(&release);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", py_simulate, METH_VARARGS, simulate_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_core", "dpro's compiled replay core (see dpro/replayer/engine.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&module); }
