/*
 * dpro's NCCL profiler plugin: records every collective (and p2p op) of each
 * communicator, each proxy send/receive op per channel, and each network step (chunk) of
 * those ops with its size and timestamps, and writes them as JSON lines, one file per
 * rank, for dpro.importers.nccl_plugin. See README.md in this directory for the format.
 *
 * Hot path (startEvent / recordEventState / stopEvent): no locks, no allocation, no
 * system call but clock_gettime (vDSO). Records live in per-communicator arrays mapped
 * at init; a record is claimed with one relaxed fetch-add and published with a release
 * store of its state. Event handles and the context are tagged integers, not pointers:
 * decoding one checks a magic byte, the context slot's generation and the index bound, so
 * an unknown, stale or forged handle is counted as a drop and never dereferenced.
 * Output is written at finalize, at dpro_nccl_trace_pause() / _flush() and at exit.
 * On any internal failure the plugin disables itself and says so once on stderr; it
 * never returns an error to NCCL from an event callback.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dpro_nccl_api.h"

#define DPN_EXPORT __attribute__((visibility("default")))
#define DPN_LIKELY(x) __builtin_expect(!!(x), 1)
#define DPN_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define DPN_PLUGIN_NAME "dpro"
#define DPN_FORMAT_VERSION 1
#define DPN_MAX_CTX 64
#define DPN_MAX_MARKS 65536
#define DPN_MAX_FILES 64
#define DPN_DEFAULT_STEPS (1u << 20)

/* record kinds (also the kind field of a handle) */
enum { K_COLL = 0, K_OP = 1, K_STEP = 2, K_KCH = 3, NKINDS = 4 };
/* record states */
enum { R_FREE = 0, R_STARTED = 1, R_STOPPED = 2 };

/* drop reasons */
enum { D_FULL = 0, D_BAD_HANDLE, D_BAD_SEQ, D_NO_CONTEXT, D_PAUSED, NDROPS };
static const char* const DROP_NAMES[NDROPS] = {"full", "bad_handle", "bad_sequence", "no_context", "paused"};

/* ---- records ------------------------------------------------------------------------ */

typedef _Atomic uint64_t au64;
typedef _Atomic uint32_t au32;

typedef struct {          /* a collective or a p2p op (128 bytes) */
  au32 state;
  uint8_t is_p2p, nch, nwarps, pad0;
  uint64_t seq;
  uint64_t count;
  int32_t root_or_peer;
  int32_t rank;
  uint64_t t0;            /* startEvent (enqueue) */
  au64 t1;                /* stopEvent (NCCL: the op is enqueued) */
  char func[16], dtype[16], algo[16], proto[16];
  uint64_t pad1[2];
} dpn_coll_t;

typedef struct {          /* a proxy op: one channel's sends to / receives from one peer (64 bytes) */
  au32 state;
  uint32_t parent;        /* coll/p2p index + 1, 0 = unknown */
  int32_t peer, nsteps, chunk;
  uint8_t channel, is_send, remote, pad0;
  int32_t pid;
  uint64_t t0;
  au64 t_progress, t1;
  uint64_t pad1;
} dpn_op_t;

typedef struct {          /* one network step (chunk) of a proxy op (64 bytes) */
  au32 state;
  uint32_t op;            /* proxy-op index + 1, 0 = unknown */
  int32_t step;
  uint32_t pad0;
  au64 bytes;             /* transSize of the step */
  uint64_t t0;            /* start: buffer posted */
  au64 ts[3];             /* send: GPU wait, peer wait, network; recv: posted, arrived, GPU-visible */
  au64 t1;                /* stop: send completed / received data consumed */
} dpn_step_t;

typedef struct {          /* a kernel channel (64 bytes) */
  au32 state;
  uint32_t parent;
  uint8_t channel, pad0[7];
  uint64_t gpu0;
  au64 gpu1;
  uint64_t t0;
  au64 t1;
  uint64_t pad1[2];
} dpn_kch_t;

_Static_assert(sizeof(dpn_coll_t) == 128, "coll record size");
_Static_assert(sizeof(dpn_op_t) == 64, "op record size");
_Static_assert(sizeof(dpn_step_t) == 64, "step record size");
_Static_assert(sizeof(dpn_kch_t) == 64, "kernel-channel record size");

static const size_t REC_SIZE[NKINDS] = {sizeof(dpn_coll_t), sizeof(dpn_op_t), sizeof(dpn_step_t), sizeof(dpn_kch_t)};
static const char* const KIND_NAMES[NKINDS] = {"colls", "ops", "steps", "kernel_channels"};

typedef struct {
  au64 v;
  char pad[56];
} padded_u64;

/* ---- contexts (one per communicator) ------------------------------------------------ */

typedef struct {
  au32 in_use;            /* slot claimed (init .. finalize) */
  au32 gen;               /* bumped when the slot is released: stale handles stop decoding */
  au32 live;              /* accepting new events */
  au32 written_final;
  int comm_written;       /* its "comm" line is out */
  int file;               /* index in g_files once its file is chosen (first flush), else -1 */
  uint64_t serial;        /* process-unique communicator number ("comm" in the output) */
  int iface;
  uint64_t comm_hash;
  char comm_name[64];
  int nnodes, nranks;
  _Atomic int rank;
  uint64_t t_init;
  void* mem[NKINDS];
  size_t mem_bytes[NKINDS];
  uint64_t cap[NKINDS];
  padded_u64 n[NKINDS];   /* records claimed (may exceed cap: the excess was dropped) */
  uint64_t written[NKINDS];
  padded_u64 drops[NDROPS];
  char dir[PATH_MAX - 64];
} dpn_ctx_t;

static dpn_ctx_t g_ctx[DPN_MAX_CTX];
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;   /* init/finalize/flush only */
static atomic_int g_disabled;
static atomic_int g_told;
static atomic_int g_paused = -1;                                /* -1: not read from env yet */
static au64 g_fake_now;                                        /* test hook: fixed clock */
static padded_u64 g_drops[NDROPS];                             /* drops with no context */
static au64 g_serial;
static pid_t g_pid;

static struct { int64_t step; uint64_t t; } g_marks[DPN_MAX_MARKS];
static au32 g_nmarks;

typedef struct { char path[PATH_MAX]; uint32_t marks_written; int header; } dpn_file_t;
static dpn_file_t g_files[DPN_MAX_FILES];
static int g_nfiles;

/* ---- small helpers ------------------------------------------------------------------ */

static inline uint64_t now_ns(void) {
  uint64_t f = atomic_load_explicit(&g_fake_now, memory_order_relaxed);
  if (DPN_UNLIKELY(f != 0)) return f;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The one message the plugin ever prints (stderr), whatever goes wrong afterwards. */
static void tell_once(const char* fmt, ...) {
  if (atomic_exchange(&g_told, 1)) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "dpro-nccl: %s\n", buf);
  fflush(stderr);
}

/* Stop recording for good (this process): every callback returns at once from now on. */
static void disable(const char* fmt, ...) {
  char buf[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  atomic_store(&g_disabled, 1);
  tell_once("%s; NCCL tracing disabled (the job goes on)", buf);
}

static inline void drop(dpn_ctx_t* c, int why) {
  padded_u64* d = c ? &c->drops[why] : &g_drops[why];
  atomic_fetch_add_explicit(&d->v, 1, memory_order_relaxed);
}

static void copy_str(char* dst, size_t n, const char* src) {
  if (!src) { dst[0] = 0; return; }
  size_t i = 0;
  for (; i + 1 < n && src[i]; i++) dst[i] = src[i];
  dst[i] = 0;
}

static int paused(void) {
  int p = atomic_load_explicit(&g_paused, memory_order_relaxed);
  if (DPN_UNLIKELY(p < 0)) {
    const char* e = getenv("DPRO_NCCL_TRACE_PAUSED");
    p = (e && *e && strcmp(e, "0") != 0) ? 1 : 0;
    int expect = -1;
    atomic_compare_exchange_strong(&g_paused, &expect, p);
    p = atomic_load(&g_paused);
  }
  return p;
}

/* ---- handles: magic(8) | gen(8) | slot(6) | kind(4) | index(38) --------------------- */

#define H_MAGIC 0xD9ull
#define C_MAGIC 0xDCull
#define H_INDEX_BITS 38
#define H_INDEX_MASK ((1ull << H_INDEX_BITS) - 1)

static inline void* make_handle(int slot, uint32_t gen, int kind, uint64_t idx) {
  uint64_t u = (H_MAGIC << 56) | ((uint64_t)(gen & 0xff) << 48) | ((uint64_t)slot << 42) |
               ((uint64_t)kind << H_INDEX_BITS) | (idx & H_INDEX_MASK);
  return (void*)(uintptr_t)u;
}

static inline void* make_context(int slot, uint32_t gen) {
  return (void*)(uintptr_t)((C_MAGIC << 56) | ((uint64_t)(gen & 0xff) << 48) | ((uint64_t)slot << 42));
}

static inline dpn_ctx_t* decode_context(void* p) {
  uint64_t u = (uint64_t)(uintptr_t)p;
  if (DPN_UNLIKELY((u >> 56) != C_MAGIC)) return NULL;
  dpn_ctx_t* c = &g_ctx[(u >> 42) & 63];
  if (DPN_UNLIKELY(((atomic_load_explicit(&c->gen, memory_order_relaxed) ^ (uint32_t)(u >> 48)) & 0xff) != 0)) return NULL;
  if (DPN_UNLIKELY(!atomic_load_explicit(&c->live, memory_order_relaxed))) return NULL;
  return c;
}

/* the record behind a handle, or NULL (counted) */
static inline void* decode_handle(void* h, int* kind_out, dpn_ctx_t** ctx_out) {
  uint64_t u = (uint64_t)(uintptr_t)h;
  if (DPN_UNLIKELY((u >> 56) != H_MAGIC)) { drop(NULL, D_BAD_HANDLE); return NULL; }
  dpn_ctx_t* c = &g_ctx[(u >> 42) & 63];
  int kind = (int)((u >> H_INDEX_BITS) & 0xf);
  uint64_t idx = u & H_INDEX_MASK;
  if (DPN_UNLIKELY(((atomic_load_explicit(&c->gen, memory_order_relaxed) ^ (uint32_t)(u >> 48)) & 0xff) != 0 ||
                   !atomic_load_explicit(&c->in_use, memory_order_relaxed) || kind >= NKINDS ||
                   idx >= c->cap[kind] || c->mem[kind] == NULL)) {
    drop(NULL, D_BAD_HANDLE);
    return NULL;
  }
  *kind_out = kind;
  *ctx_out = c;
  return (char*)c->mem[kind] + idx * REC_SIZE[kind];
}

/* index + 1 of the record of `kind` behind a parent handle of this context, 0 if none */
static inline uint32_t parent_index(dpn_ctx_t* c, void* h, int kind_a, int kind_b) {
  uint64_t u = (uint64_t)(uintptr_t)h;
  if ((u >> 56) != H_MAGIC || &g_ctx[(u >> 42) & 63] != c) return 0;
  if (((atomic_load_explicit(&c->gen, memory_order_relaxed) ^ (uint32_t)(u >> 48)) & 0xff) != 0) return 0;
  int kind = (int)((u >> H_INDEX_BITS) & 0xf);
  uint64_t idx = u & H_INDEX_MASK;
  if ((kind != kind_a && kind != kind_b) || idx >= c->cap[kind] || idx >= 0xffffffffull) return 0;
  return (uint32_t)idx + 1;
}

static inline int claim(dpn_ctx_t* c, int kind, uint64_t* idx) {
  uint64_t i = atomic_fetch_add_explicit(&c->n[kind].v, 1, memory_order_relaxed);
  if (DPN_UNLIKELY(i >= c->cap[kind])) { drop(c, D_FULL); return 0; }
  *idx = i;
  return 1;
}

/* ---- event callbacks ---------------------------------------------------------------- */

/* what startEvent needs from any descriptor version */
typedef struct {
  uint64_t type;
  void* parent;
  int rank;
  /* coll / p2p */
  uint64_t seq; const char* func; size_t count; int root_or_peer; const char* dtype;
  int nch, nwarps; const char* algo; const char* proto;
  /* proxy op */
  pid_t pid; int channel, peer, nsteps, chunk, is_send;
  /* proxy step */
  int step;
  /* kernel channel */
  uint64_t ptimer;
} dpn_ev_t;

static dpn_result_t start_common(void* context, void** eHandle, const dpn_ev_t* e) {
  dpn_ctx_t* c = decode_context(context);
  if (DPN_UNLIKELY(c == NULL)) {
    if (context != NULL) drop(NULL, D_NO_CONTEXT);
    return DPN_NCCL_SUCCESS;
  }
  if (DPN_UNLIKELY(atomic_load_explicit(&g_disabled, memory_order_relaxed))) return DPN_NCCL_SUCCESS;
  if (DPN_UNLIKELY(paused())) { drop(c, D_PAUSED); return DPN_NCCL_SUCCESS; }
  int slot = (int)(c - g_ctx);
  uint32_t gen = atomic_load_explicit(&c->gen, memory_order_relaxed);
  uint64_t i;
  switch (e->type) {
  case DPN_EV_PROXY_STEP: {
    if (!claim(c, K_STEP, &i)) return DPN_NCCL_SUCCESS;
    dpn_step_t* r = (dpn_step_t*)c->mem[K_STEP] + i;
    r->op = parent_index(c, e->parent, K_OP, K_OP);
    r->step = e->step;
    r->t0 = now_ns();
    atomic_store_explicit(&r->state, R_STARTED, memory_order_release);
    *eHandle = make_handle(slot, gen, K_STEP, i);
    return DPN_NCCL_SUCCESS;
  }
  case DPN_EV_PROXY_OP: {
    if (!claim(c, K_OP, &i)) return DPN_NCCL_SUCCESS;
    dpn_op_t* r = (dpn_op_t*)c->mem[K_OP] + i;
    /* PXN: an op progressed for another process carries that process's parent handle */
    r->remote = (e->pid != 0 && e->pid != g_pid);
    r->parent = r->remote ? 0 : parent_index(c, e->parent, K_COLL, K_COLL);
    r->peer = e->peer;
    r->nsteps = e->nsteps;
    r->chunk = e->chunk;
    r->channel = (uint8_t)e->channel;
    r->is_send = (uint8_t)(e->is_send != 0);
    r->pid = (int32_t)e->pid;
    r->t0 = now_ns();
    atomic_store_explicit(&r->state, R_STARTED, memory_order_release);
    *eHandle = make_handle(slot, gen, K_OP, i);
    return DPN_NCCL_SUCCESS;
  }
  case DPN_EV_COLL:
  case DPN_EV_P2P: {
    if (!claim(c, K_COLL, &i)) return DPN_NCCL_SUCCESS;
    dpn_coll_t* r = (dpn_coll_t*)c->mem[K_COLL] + i;
    r->is_p2p = (e->type == DPN_EV_P2P);
    r->seq = e->seq;
    r->count = e->count;
    r->root_or_peer = e->root_or_peer;
    r->rank = e->rank;
    r->nch = (uint8_t)e->nch;
    r->nwarps = (uint8_t)e->nwarps;
    copy_str(r->func, sizeof r->func, e->func);
    copy_str(r->dtype, sizeof r->dtype, e->dtype);
    copy_str(r->algo, sizeof r->algo, e->algo);
    copy_str(r->proto, sizeof r->proto, e->proto);
    if (atomic_load_explicit(&c->rank, memory_order_relaxed) < 0) atomic_store(&c->rank, e->rank);
    r->t0 = now_ns();
    atomic_store_explicit(&r->state, R_STARTED, memory_order_release);
    *eHandle = make_handle(slot, gen, K_COLL, i);
    return DPN_NCCL_SUCCESS;
  }
  case DPN_EV_KERNEL_CH: {
    if (!claim(c, K_KCH, &i)) return DPN_NCCL_SUCCESS;
    dpn_kch_t* r = (dpn_kch_t*)c->mem[K_KCH] + i;
    r->parent = parent_index(c, e->parent, K_COLL, K_COLL);
    r->channel = (uint8_t)e->channel;
    r->gpu0 = e->ptimer;
    r->t0 = now_ns();
    atomic_store_explicit(&r->state, R_STARTED, memory_order_release);
    *eHandle = make_handle(slot, gen, K_KCH, i);
    return DPN_NCCL_SUCCESS;
  }
  default:
    return DPN_NCCL_SUCCESS;   /* not recorded: NULL handle */
  }
}

static dpn_result_t start_v5(void* context, void** eHandle, dpn_descr_v5_t* d) {
  if (DPN_UNLIKELY(eHandle == NULL)) { drop(NULL, D_BAD_HANDLE); return DPN_NCCL_SUCCESS; }
  *eHandle = NULL;
  if (DPN_UNLIKELY(d == NULL)) { drop(NULL, D_BAD_SEQ); return DPN_NCCL_SUCCESS; }
  dpn_ev_t e;
  e.type = d->type;
  e.parent = d->parentObj;
  e.rank = d->rank;
  switch (d->type) {
  case DPN_EV_PROXY_STEP:
    e.step = d->proxyStep.step;
    break;
  case DPN_EV_PROXY_OP:
    e.pid = d->proxyOp.pid; e.channel = d->proxyOp.channelId; e.peer = d->proxyOp.peer;
    e.nsteps = d->proxyOp.nSteps; e.chunk = d->proxyOp.chunkSize; e.is_send = d->proxyOp.isSend;
    break;
  case DPN_EV_COLL:
    e.seq = d->coll.seqNumber; e.func = d->coll.func; e.count = d->coll.count; e.root_or_peer = d->coll.root;
    e.dtype = d->coll.datatype; e.nch = d->coll.nChannels; e.nwarps = d->coll.nWarps;
    e.algo = d->coll.algo; e.proto = d->coll.proto;
    break;
  case DPN_EV_P2P:
    e.seq = 0; e.func = d->p2p.func; e.count = d->p2p.count; e.root_or_peer = d->p2p.peer;
    e.dtype = d->p2p.datatype; e.nch = d->p2p.nChannels; e.nwarps = 0; e.algo = NULL; e.proto = NULL;
    break;
  case DPN_EV_KERNEL_CH:
    e.channel = d->kernelCh.channelId; e.ptimer = d->kernelCh.pTimer;
    break;
  default:
    return DPN_NCCL_SUCCESS;
  }
  return start_common(context, eHandle, &e);
}

static dpn_result_t start_v4(void* context, void** eHandle, dpn_descr_v4_t* d) {
  if (DPN_UNLIKELY(eHandle == NULL)) { drop(NULL, D_BAD_HANDLE); return DPN_NCCL_SUCCESS; }
  *eHandle = NULL;
  if (DPN_UNLIKELY(d == NULL)) { drop(NULL, D_BAD_SEQ); return DPN_NCCL_SUCCESS; }
  dpn_ev_t e;
  e.type = d->type;
  e.parent = d->parentObj;
  e.rank = d->rank;
  switch (d->type) {
  case DPN_EV_PROXY_STEP:
    e.step = d->proxyStep.step;
    break;
  case DPN_EV_PROXY_OP:
    e.pid = d->proxyOp.pid; e.channel = d->proxyOp.channelId; e.peer = d->proxyOp.peer;
    e.nsteps = d->proxyOp.nSteps; e.chunk = d->proxyOp.chunkSize; e.is_send = d->proxyOp.isSend;
    break;
  case DPN_EV_COLL:
    e.seq = d->coll.seqNumber; e.func = d->coll.func; e.count = d->coll.count; e.root_or_peer = d->coll.root;
    e.dtype = d->coll.datatype; e.nch = d->coll.nChannels; e.nwarps = d->coll.nWarps;
    e.algo = d->coll.algo; e.proto = d->coll.proto;
    break;
  case DPN_EV_P2P:
    e.seq = 0; e.func = d->p2p.func; e.count = d->p2p.count; e.root_or_peer = d->p2p.peer;
    e.dtype = d->p2p.datatype; e.nch = d->p2p.nChannels; e.nwarps = 0; e.algo = NULL; e.proto = NULL;
    break;
  case DPN_EV_KERNEL_CH:
    e.channel = d->kernelCh.channelId; e.ptimer = d->kernelCh.pTimer;
    break;
  default:
    return DPN_NCCL_SUCCESS;
  }
  return start_common(context, eHandle, &e);
}

static dpn_result_t start_v3(void* context, void** eHandle, dpn_descr_v3_t* d) {
  if (DPN_UNLIKELY(eHandle == NULL)) { drop(NULL, D_BAD_HANDLE); return DPN_NCCL_SUCCESS; }
  *eHandle = NULL;
  if (DPN_UNLIKELY(d == NULL)) { drop(NULL, D_BAD_SEQ); return DPN_NCCL_SUCCESS; }
  dpn_ev_t e;
  e.type = d->type;
  e.parent = d->parentObj;
  e.rank = d->rank;
  switch (d->type) {
  case DPN_EV_PROXY_STEP:
    e.step = d->proxyStep.step;
    break;
  case DPN_EV_PROXY_OP:
    e.pid = d->proxyOp.pid; e.channel = d->proxyOp.channelId; e.peer = d->proxyOp.peer;
    e.nsteps = d->proxyOp.nSteps; e.chunk = d->proxyOp.chunkSize; e.is_send = d->proxyOp.isSend;
    break;
  case DPN_EV_COLL:
    e.seq = d->coll.seqNumber; e.func = d->coll.func; e.count = d->coll.count; e.root_or_peer = d->coll.root;
    e.dtype = d->coll.datatype; e.nch = d->coll.nMaxChannels; e.nwarps = d->coll.nWarps;
    e.algo = d->coll.algo; e.proto = d->coll.proto;
    break;
  case DPN_EV_P2P:
    e.seq = 0; e.func = d->p2p.func; e.count = d->p2p.count; e.root_or_peer = d->p2p.peer;
    e.dtype = d->p2p.datatype; e.nch = 0; e.nwarps = 0; e.algo = NULL; e.proto = NULL;
    break;
  case DPN_EV_KERNEL_CH:
    e.channel = d->kernelCh.channelId; e.ptimer = 0;
    break;
  default:
    return DPN_NCCL_SUCCESS;
  }
  return start_common(context, eHandle, &e);
}

static dpn_result_t record_state(void* eHandle, int eState, dpn_state_args_t* a) {
  int kind;
  dpn_ctx_t* c;
  void* rec = decode_handle(eHandle, &kind, &c);
  if (DPN_UNLIKELY(rec == NULL)) return DPN_NCCL_SUCCESS;
  au32* state = (au32*)rec;
  if (DPN_UNLIKELY(atomic_load_explicit(state, memory_order_relaxed) != R_STARTED)) { drop(c, D_BAD_SEQ); return DPN_NCCL_SUCCESS; }
  if (kind == K_STEP) {
    dpn_step_t* r = (dpn_step_t*)rec;
    int k;
    switch (eState) {
    case DPN_ST_STEP_SEND_GPU_WAIT:
      /* NCCL records it in the same progress pass as the start: reuse the start time */
      if (atomic_load_explicit(&r->ts[0], memory_order_relaxed) == 0)
        atomic_store_explicit(&r->ts[0], r->t0, memory_order_relaxed);
      return DPN_NCCL_SUCCESS;
    case DPN_ST_STEP_RECV_WAIT: k = 0; break;
    case DPN_ST_STEP_SEND_PEER_WAIT: case DPN_ST_STEP_RECV_FLUSH_WAIT: k = 1; break;
    case DPN_ST_STEP_SEND_WAIT: case DPN_ST_STEP_RECV_GPU_WAIT: k = 2; break;
    default: return DPN_NCCL_SUCCESS;
    }
    /* a state may be recorded again while NCCL retries: keep the first time */
    if (atomic_load_explicit(&r->ts[k], memory_order_relaxed) == 0)
      atomic_store_explicit(&r->ts[k], now_ns(), memory_order_relaxed);
    if (a != NULL && a->proxyStep.transSize != 0)
      atomic_store_explicit(&r->bytes, (uint64_t)a->proxyStep.transSize, memory_order_relaxed);
  } else if (kind == K_OP) {
    if (eState == DPN_ST_PROXY_OP_IN_PROGRESS) {
      dpn_op_t* r = (dpn_op_t*)rec;
      if (atomic_load_explicit(&r->t_progress, memory_order_relaxed) == 0)
        atomic_store_explicit(&r->t_progress, now_ns(), memory_order_relaxed);
    }
  } else if (kind == K_KCH) {
    if (eState == DPN_ST_KERNEL_CH_STOP && a != NULL)
      atomic_store_explicit(&((dpn_kch_t*)rec)->gpu1, a->kernelCh.pTimer, memory_order_relaxed);
  }
  return DPN_NCCL_SUCCESS;
}

static dpn_result_t stop_event(void* eHandle) {
  int kind;
  dpn_ctx_t* c;
  void* rec = decode_handle(eHandle, &kind, &c);
  if (DPN_UNLIKELY(rec == NULL)) return DPN_NCCL_SUCCESS;
  au32* state = (au32*)rec;
  if (DPN_UNLIKELY(atomic_load_explicit(state, memory_order_relaxed) != R_STARTED)) { drop(c, D_BAD_SEQ); return DPN_NCCL_SUCCESS; }
  uint64_t t = now_ns();
  switch (kind) {
  case K_STEP: atomic_store_explicit(&((dpn_step_t*)rec)->t1, t, memory_order_relaxed); break;
  case K_OP: atomic_store_explicit(&((dpn_op_t*)rec)->t1, t, memory_order_relaxed); break;
  case K_COLL: atomic_store_explicit(&((dpn_coll_t*)rec)->t1, t, memory_order_relaxed); break;
  default: atomic_store_explicit(&((dpn_kch_t*)rec)->t1, t, memory_order_relaxed); break;
  }
  atomic_store_explicit(state, R_STOPPED, memory_order_release);
  return DPN_NCCL_SUCCESS;
}

/* ---- output --------------------------------------------------------------------------- */

typedef struct {
  int fd;
  char* buf;
  size_t len, cap;
  int failed;
} dpn_out_t;

static void out_flush(dpn_out_t* o) {
  size_t off = 0;
  while (!o->failed && off < o->len) {
    ssize_t w = write(o->fd, o->buf + off, o->len - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      o->failed = errno ? errno : EIO;
      break;
    }
    off += (size_t)w;
  }
  o->len = 0;
}

static void out_printf(dpn_out_t* o, const char* fmt, ...) {
  if (o->failed) return;
  if (o->cap - o->len < 1024) out_flush(o);
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
  va_end(ap);
  if (n > 0 && (size_t)n < o->cap - o->len) o->len += (size_t)n;
}

static inline void out_raw(dpn_out_t* o, const char* str) {
  if (o->failed) return;
  size_t n = strlen(str);
  if (o->cap - o->len < n + 64) out_flush(o);
  memcpy(o->buf + o->len, str, n);
  o->len += n;
}

static inline void out_i(dpn_out_t* o, int64_t v) {
  if (o->failed) return;
  if (o->cap - o->len < 64) out_flush(o);
  char tmp[24];
  int n = 0;
  uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
  do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
  if (v < 0) o->buf[o->len++] = '-';
  while (n) o->buf[o->len++] = tmp[--n];
}

/* a timestamp as ns relative to the communicator's base time; null when never taken */
static inline void out_t(dpn_out_t* o, uint64_t t, uint64_t base) {
  if (t == 0) out_raw(o, "null");
  else out_i(o, (int64_t)(t - base));
}

/* JSON string with anything unusual replaced (names come from NCCL and users) */
static void json_str(char* dst, size_t n, const char* s) {
  size_t j = 0;
  for (size_t i = 0; s && s[i] && j + 2 < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    dst[j++] = (ch < 0x20 || ch == '"' || ch == '\\' || ch >= 0x7f) ? '_' : (char)ch;
  }
  dst[j] = 0;
}

static int mkdirs(const char* dir) {
  char tmp[PATH_MAX];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof tmp) return -1;
  memcpy(tmp, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (tmp[i] == '/' || tmp[i] == 0) {
      char ch = tmp[i];
      tmp[i] = 0;
      if (mkdir(tmp, 0777) != 0 && errno != EEXIST) return -1;
      tmp[i] = ch;
    }
  }
  return 0;
}

static int env_rank(void) {
  static const char* const names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char* v = getenv(names[i]);
    if (v && *v) {
      char* end;
      long r = strtol(v, &end, 10);
      if (*end == 0 && r >= 0 && r < INT_MAX) return (int)r;
    }
  }
  return -1;
}

static const char* iface_name(int v) {
  switch (v) { case 3: return "v3"; case 4: return "v4"; case 5: return "v5"; default: return "v6"; }
}

/* Write the records of c not written yet. Not final: only completed records, up to the
 * first one still open in each kind (the rest waits for the next flush). Final: all of
 * them, open ones marked "open":1, plus the context's summary. Caller holds g_mutex. */
static int flush_ctx(dpn_ctx_t* c, int final) {
  if (atomic_load(&c->written_final)) return 0;
  int grank = env_rank();
  int crank = atomic_load(&c->rank);
  dpn_file_t* f = (c->file >= 0 && c->file < g_nfiles) ? &g_files[c->file] : NULL;
  if (f == NULL) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/nccl_rank%d_pid%d.jsonl", c->dir, grank >= 0 ? grank : crank, (int)g_pid) >=
        (int)sizeof path) {
      disable("output path too long under %s", c->dir);
      return -1;
    }
    for (int i = 0; i < g_nfiles; i++)
      if (strcmp(g_files[i].path, path) == 0) { f = &g_files[i]; c->file = i; }
    if (f == NULL) {
      if (g_nfiles == DPN_MAX_FILES) { disable("more than %d output files", DPN_MAX_FILES); return -1; }
      c->file = g_nfiles;
      f = &g_files[g_nfiles++];
      memcpy(f->path, path, sizeof path);
      f->marks_written = 0;
      f->header = 0;
    }
  }
  const char* path = f->path;
  if (mkdirs(c->dir) != 0) {
    disable("cannot create %s: %s", c->dir, strerror(errno));
    return -1;
  }
  dpn_out_t o = {.fd = -1, .cap = 1 << 20};
  o.buf = (char*)malloc(o.cap);
  if (!o.buf) { disable("out of memory while writing"); return -1; }
  o.fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (f->header ? 0 : O_TRUNC), 0666);
  if (o.fd < 0) {
    disable("cannot write %s: %s", path, strerror(errno));
    free(o.buf);
    return -1;
  }
  if (!f->header) {
    char host[256] = "";
    char hj[256];
    gethostname(host, sizeof host - 1);
    json_str(hj, sizeof hj, host);
    out_printf(&o,
               "{\"type\":\"header\",\"format\":\"dpro-nccl-trace\",\"version\":%d,\"plugin\":\"%s\",\"pid\":%d,"
               "\"host\":\"%s\",\"rank\":%d,\"clock\":\"CLOCK_REALTIME\",\"unit\":\"ns\",\"realtime_ns\":%llu,"
               "\"monotonic_ns\":%llu}\n",
               DPN_FORMAT_VERSION, DPN_PLUGIN_NAME, (int)g_pid, hj, grank, (unsigned long long)now_ns(),
               (unsigned long long)mono_ns());
    f->header = 1;
  }
  unsigned long long cm = (unsigned long long)c->serial;
  if (!c->comm_written) {
    c->comm_written = 1;
    char nj[128];
    json_str(nj, sizeof nj, c->comm_name);
    out_printf(&o,
               "{\"type\":\"comm\",\"comm\":%llu,\"hash\":\"0x%016llx\",\"name\":\"%s\",\"nnodes\":%d,\"nranks\":%d,"
               "\"rank\":%d,\"interface\":\"%s\",\"t\":%llu,\"capacity\":{\"colls\":%llu,\"ops\":%llu,\"steps\":%llu,"
               "\"kernel_channels\":%llu}}\n",
               cm, (unsigned long long)c->comm_hash, nj, c->nnodes, c->nranks, crank, iface_name(c->iface),
               (unsigned long long)c->t_init, (unsigned long long)c->cap[K_COLL], (unsigned long long)c->cap[K_OP],
               (unsigned long long)c->cap[K_STEP], (unsigned long long)c->cap[K_KCH]);
  }
  uint32_t nm = atomic_load(&g_nmarks);
  if (nm > DPN_MAX_MARKS) nm = DPN_MAX_MARKS;
  for (uint32_t i = f->marks_written; i < nm; i++)
    out_printf(&o, "{\"type\":\"mark\",\"step\":%lld,\"t\":%llu}\n", (long long)g_marks[i].step,
               (unsigned long long)g_marks[i].t);
  f->marks_written = nm;
  uint64_t open_left = 0;
  for (int k = 0; k < NKINDS; k++) {
    uint64_t n = atomic_load(&c->n[k].v);
    if (n > c->cap[k]) n = c->cap[k];
    uint64_t i = c->written[k];
    for (; i < n; i++) {
      char* rec = (char*)c->mem[k] + i * REC_SIZE[k];
      uint32_t st = atomic_load_explicit((au32*)rec, memory_order_acquire);
      if (st != R_STOPPED && !final) break;
      if (st == R_FREE) continue; /* claimed but never filled in */
      int open_ = st != R_STOPPED;
      open_left += (uint64_t)open_;
      uint64_t b = c->t_init;
      if (k == K_COLL) {
        dpn_coll_t* r = (dpn_coll_t*)rec;
        char fn[16], dt[16], al[16], pr[16];
        json_str(fn, sizeof fn, r->func);
        json_str(dt, sizeof dt, r->dtype);
        json_str(al, sizeof al, r->algo);
        json_str(pr, sizeof pr, r->proto);
        if (r->is_p2p) {
          out_printf(&o,
                     "{\"type\":\"p2p\",\"comm\":%llu,\"id\":%llu,\"func\":\"%s\",\"count\":%llu,\"dtype\":\"%s\","
                     "\"peer\":%d,\"nch\":%d,\"rank\":%d",
                     cm, (unsigned long long)i, fn, (unsigned long long)r->count, dt, r->root_or_peer, r->nch, r->rank);
        } else {
          out_printf(&o,
                     "{\"type\":\"coll\",\"comm\":%llu,\"id\":%llu,\"seq\":%llu,\"func\":\"%s\",\"count\":%llu,"
                     "\"dtype\":\"%s\",\"root\":%d,\"algo\":\"%s\",\"proto\":\"%s\",\"nch\":%d,\"nwarps\":%d,"
                     "\"rank\":%d",
                     cm, (unsigned long long)i, (unsigned long long)r->seq, fn, (unsigned long long)r->count, dt,
                     r->root_or_peer, al, pr, r->nch, r->nwarps, r->rank);
        }
        out_raw(&o, ",\"t0\":");
        out_t(&o, r->t0, b);
        out_raw(&o, ",\"t1\":");
        out_t(&o, atomic_load(&r->t1), b);
      } else if (k == K_OP) {
        dpn_op_t* r = (dpn_op_t*)rec;
        out_printf(&o,
                   "{\"type\":\"op\",\"comm\":%llu,\"id\":%llu,\"coll\":%lld,\"ch\":%d,\"peer\":%d,\"send\":%d,"
                   "\"nsteps\":%d,\"chunk\":%d,\"remote\":%d",
                   cm, (unsigned long long)i, (long long)r->parent - 1, r->channel, r->peer, r->is_send, r->nsteps,
                   r->chunk, r->remote);
        out_raw(&o, ",\"t0\":");
        out_t(&o, r->t0, b);
        out_raw(&o, ",\"tp\":");
        out_t(&o, atomic_load(&r->t_progress), b);
        out_raw(&o, ",\"t1\":");
        out_t(&o, atomic_load(&r->t1), b);
      } else if (k == K_STEP) {
        /* the bulk of the output: formatted by hand */
        dpn_step_t* r = (dpn_step_t*)rec;
        out_raw(&o, "{\"type\":\"step\",\"comm\":");
        out_i(&o, (int64_t)cm);
        out_raw(&o, ",\"op\":");
        out_i(&o, (int64_t)r->op - 1);
        out_raw(&o, ",\"step\":");
        out_i(&o, r->step);
        out_raw(&o, ",\"bytes\":");
        out_i(&o, (int64_t)atomic_load(&r->bytes));
        out_raw(&o, ",\"t\":[");
        out_t(&o, r->t0, b);
        for (int j = 0; j < 3; j++) {
          out_raw(&o, ",");
          out_t(&o, atomic_load(&r->ts[j]), b);
        }
        out_raw(&o, ",");
        out_t(&o, atomic_load(&r->t1), b);
        out_raw(&o, "]");
      } else {
        dpn_kch_t* r = (dpn_kch_t*)rec;
        out_printf(&o, "{\"type\":\"kch\",\"comm\":%llu,\"coll\":%lld,\"ch\":%d,\"gpu0\":%llu,\"gpu1\":%llu", cm,
                   (long long)r->parent - 1, r->channel, (unsigned long long)r->gpu0,
                   (unsigned long long)atomic_load(&r->gpu1));
        out_raw(&o, ",\"t0\":");
        out_t(&o, r->t0, b);
        out_raw(&o, ",\"t1\":");
        out_t(&o, atomic_load(&r->t1), b);
      }
      out_raw(&o, open_ ? ",\"open\":1}\n" : "}\n");
    }
    c->written[k] = i;
  }
  if (final) {
    out_printf(&o, "{\"type\":\"summary\",\"comm\":%llu", cm);
    for (int k = 0; k < NKINDS; k++) {
      uint64_t n = atomic_load(&c->n[k].v);
      out_printf(&o, ",\"%s\":%llu", KIND_NAMES[k], (unsigned long long)(n > c->cap[k] ? c->cap[k] : n));
    }
    out_printf(&o, ",\"open\":%llu,\"dropped\":{", (unsigned long long)open_left);
    for (int d = 0; d < NDROPS; d++)
      out_printf(&o, "%s\"%s\":%llu", d ? "," : "", DROP_NAMES[d], (unsigned long long)atomic_load(&c->drops[d].v));
    out_printf(&o, "},\"process_dropped\":{");
    for (int d = 0; d < NDROPS; d++)
      out_printf(&o, "%s\"%s\":%llu", d ? "," : "", DROP_NAMES[d], (unsigned long long)atomic_load(&g_drops[d].v));
    out_printf(&o, "}}\n");
    atomic_store(&c->written_final, 1);
  }
  out_flush(&o);
  int failed = o.failed;
  close(o.fd);
  free(o.buf);
  if (failed) {
    disable("cannot write %s: %s", path, strerror(failed));
    return -1;
  }
  return 0;
}

/* ---- init / finalize ---------------------------------------------------------------- */

/* Record arrays: anonymous mappings, committed page by page as records are claimed
 * (first touch costs a page fault per 64 records on the hot path), or all at init with
 * DPRO_NCCL_TRACE_PREFAULT=1. */
static void* map_records(size_t bytes, int prefault) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (prefault ? MAP_POPULATE : 0), -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end;
  unsigned long long x = strtoull(v, &end, 10);
  return (*end == 0 && x > 0) ? (uint64_t)x : dflt;
}

static int init_common(void** context, int* eActivationMask, int iface, uint64_t hash, const char* name,
                       int nnodes, int nranks, int rank, dpn_logger_t logfn) {
  if (context == NULL) return DPN_NCCL_SUCCESS;
  *context = NULL;
  const char* dir = getenv("DPRO_NCCL_TRACE_DIR");
  if (dir == NULL || *dir == 0) return DPN_NCCL_SUCCESS; /* not asked to trace: stay silent and inert */
  if (atomic_load(&g_disabled)) return DPN_NCCL_SUCCESS;
  if (strlen(dir) >= sizeof g_ctx[0].dir) { disable("DPRO_NCCL_TRACE_DIR is too long"); return DPN_NCCL_SUCCESS; }
  (void)paused();
  pthread_mutex_lock(&g_mutex);
  g_pid = getpid(); /* (again after a fork) */
  int slot = -1;
  for (int i = 0; i < DPN_MAX_CTX; i++)
    if (!atomic_load(&g_ctx[i].in_use)) { slot = i; break; }
  if (slot < 0) {
    pthread_mutex_unlock(&g_mutex);
    tell_once("more than %d communicators traced at once; communicator %s is not traced (the job goes on)",
              DPN_MAX_CTX, name ? name : "");
    return DPN_NCCL_SUCCESS;
  }
  dpn_ctx_t* c = &g_ctx[slot];
  uint64_t steps = env_u64("DPRO_NCCL_TRACE_EVENTS", DPN_DEFAULT_STEPS);
  if (steps > (1ull << 32)) steps = 1ull << 32;
  uint64_t cap[NKINDS];
  cap[K_STEP] = steps;
  cap[K_OP] = steps / 4 + 16;
  cap[K_COLL] = steps / 16 + 16;
  cap[K_KCH] = steps / 4 + 16;
  int ok = 1;
  int prefault = (int)env_u64("DPRO_NCCL_TRACE_PREFAULT", 0);
  for (int k = 0; k < NKINDS; k++) {
    size_t bytes = (size_t)cap[k] * REC_SIZE[k];
    if (c->mem[k] != NULL && c->mem_bytes[k] == bytes) continue; /* reuse the slot's old (zeroed) mapping */
    void* m = map_records(bytes, prefault);
    if (m == NULL) { ok = 0; break; }
    c->mem[k] = m; /* an old mapping of another size is left mapped: a stale writer may still touch it */
    c->mem_bytes[k] = bytes;
  }
  if (!ok) {
    pthread_mutex_unlock(&g_mutex);
    disable("cannot map %llu trace records: %s", (unsigned long long)steps, strerror(errno));
    return DPN_NCCL_SUCCESS;
  }
  for (int k = 0; k < NKINDS; k++) {
    c->cap[k] = cap[k];
    atomic_store(&c->n[k].v, 0);
    c->written[k] = 0;
  }
  for (int d = 0; d < NDROPS; d++) atomic_store(&c->drops[d].v, 0);
  c->serial = atomic_fetch_add(&g_serial, 1);
  c->iface = iface;
  c->comm_hash = hash;
  copy_str(c->comm_name, sizeof c->comm_name, name);
  c->nnodes = nnodes;
  c->nranks = nranks;
  atomic_store(&c->rank, rank);
  c->t_init = now_ns();
  copy_str(c->dir, sizeof c->dir, dir);
  atomic_store(&c->written_final, 0);
  c->comm_written = 0;
  c->file = -1;
  atomic_store(&c->in_use, 1);
  atomic_store(&c->live, 1);
  uint32_t gen = atomic_load(&c->gen);
  pthread_mutex_unlock(&g_mutex);

  if (eActivationMask != NULL) {
    int mask = DPN_EV_COLL | DPN_EV_P2P | DPN_EV_PROXY_OP | DPN_EV_PROXY_STEP;
    if (env_u64("DPRO_NCCL_TRACE_KERNEL", 0)) mask |= DPN_EV_KERNEL_CH;
    *eActivationMask = mask;
  }
  *context = make_context(slot, gen);
  if (logfn)
    logfn(DPN_LOG_INFO, DPN_LOG_SUBSYS_INIT, __FILE__, __LINE__,
          "dpro-nccl: tracing communicator %s (rank %d of %d, interface %s) into %s", name ? name : "", rank, nranks,
          iface_name(iface), dir);
  return DPN_NCCL_SUCCESS;
}

static void release_ctx(dpn_ctx_t* c) {
  atomic_store(&c->in_use, 0);
  for (int k = 0; k < NKINDS; k++) {
    c->cap[k] = 0;
    /* give the pages back but keep the mapping: a late writer reads/writes zero pages */
    if (c->mem[k]) madvise(c->mem[k], c->mem_bytes[k], MADV_DONTNEED);
  }
  atomic_fetch_add(&c->gen, 1);
}

static dpn_result_t finalize_ctx(void* context) {
  uint64_t u = (uint64_t)(uintptr_t)context;
  if ((u >> 56) != C_MAGIC) {
    if (context != NULL) drop(NULL, D_NO_CONTEXT);
    return DPN_NCCL_SUCCESS;
  }
  dpn_ctx_t* c = &g_ctx[(u >> 42) & 63];
  pthread_mutex_lock(&g_mutex);
  if (((atomic_load(&c->gen) ^ (uint32_t)(u >> 48)) & 0xff) != 0 || !atomic_load(&c->in_use)) {
    pthread_mutex_unlock(&g_mutex);
    drop(NULL, D_NO_CONTEXT);
    return DPN_NCCL_SUCCESS;
  }
  atomic_store(&c->live, 0);
  if (!atomic_load(&g_disabled)) flush_ctx(c, 1);
  release_ctx(c);
  pthread_mutex_unlock(&g_mutex);
  return DPN_NCCL_SUCCESS;
}

static dpn_result_t init_v3(void** context, int* eActivationMask) {
  return (dpn_result_t)init_common(context, eActivationMask, 3, 0, "", 0, 0, -1, NULL);
}
static dpn_result_t init_v4(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                            int nNodes, int nranks, int rank, dpn_logger_t logfn) {
  return (dpn_result_t)init_common(context, eActivationMask, 4, commHash, commName, nNodes, nranks, rank, logfn);
}
static dpn_result_t init_v5(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                            int nranks, int rank, dpn_logger_t logfn) {
  return (dpn_result_t)init_common(context, eActivationMask, 5, commId, commName, nNodes, nranks, rank, logfn);
}
static dpn_result_t init_v6(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                            int nranks, int rank, dpn_logger_t logfn) {
  return (dpn_result_t)init_common(context, eActivationMask, 6, commId, commName, nNodes, nranks, rank, logfn);
}

/* NCCL looks these up by name, newest first. */
DPN_EXPORT const dpn_profiler_v6_t ncclProfiler_v6 = {DPN_PLUGIN_NAME, init_v6, start_v5, stop_event, record_state, finalize_ctx};
DPN_EXPORT const dpn_profiler_v5_t ncclProfiler_v5 = {DPN_PLUGIN_NAME, init_v5, start_v5, stop_event, record_state, finalize_ctx};
DPN_EXPORT const dpn_profiler_v4_t ncclProfiler_v4 = {DPN_PLUGIN_NAME, init_v4, start_v4, stop_event, record_state, finalize_ctx};
DPN_EXPORT const dpn_profiler_v3_t ncclProfiler_v3 = {DPN_PLUGIN_NAME, init_v3, start_v3, stop_event, record_state, finalize_ctx};

/* ---- control API for the training process (ctypes) ---------------------------------- */

static int flush_all(int final) {
  int rc = 0;
  pthread_mutex_lock(&g_mutex);
  for (int i = 0; i < DPN_MAX_CTX; i++)
    if (atomic_load(&g_ctx[i].in_use) && !atomic_load(&g_disabled))
      if (flush_ctx(&g_ctx[i], final) != 0) rc = -1;
  pthread_mutex_unlock(&g_mutex);
  return atomic_load(&g_disabled) ? -1 : rc;
}

/* Mark the start of training step `step` (call it where the framework's step begins). */
DPN_EXPORT void dpro_nccl_trace_mark_step(long long step) {
  uint32_t i = atomic_fetch_add(&g_nmarks, 1);
  if (i >= DPN_MAX_MARKS) { drop(NULL, D_FULL); return; }
  g_marks[i].step = step;
  g_marks[i].t = now_ns();
}

/* End of a profiling window: stop recording and write what is complete. */
DPN_EXPORT int dpro_nccl_trace_pause(void) {
  (void)paused();
  atomic_store(&g_paused, 1);
  return flush_all(0);
}

/* Start (or restart) recording. */
DPN_EXPORT void dpro_nccl_trace_resume(void) {
  (void)paused();
  atomic_store(&g_paused, 0);
}

/* Write what is complete now (recording goes on). 0 on success, -1 if disabled/failed. */
DPN_EXPORT int dpro_nccl_trace_flush(void) { return flush_all(0); }

/* 1 when tracing has disabled itself after an internal failure. */
DPN_EXPORT int dpro_nccl_trace_disabled(void) { return atomic_load(&g_disabled); }

/* Events dropped so far, all reasons and communicators (live ones) together. */
DPN_EXPORT unsigned long long dpro_nccl_trace_dropped(void) {
  unsigned long long s = 0;
  for (int d = 0; d < NDROPS; d++) {
    s += atomic_load(&g_drops[d].v);
    for (int i = 0; i < DPN_MAX_CTX; i++)
      if (atomic_load(&g_ctx[i].in_use)) s += atomic_load(&g_ctx[i].drops[d].v);
  }
  return s;
}

/* Drops by reason (index as DROP_NAMES) without a communicator (unknown handles ...). */
DPN_EXPORT unsigned long long dpro_nccl_trace_dropped_global(int reason) {
  return (reason >= 0 && reason < NDROPS) ? atomic_load(&g_drops[reason].v) : 0;
}

/* Test hook: a fixed clock (ns since the epoch) for every timestamp; 0 = the real clock. */
DPN_EXPORT void dpro_nccl_trace_test_set_clock(unsigned long long ns) { atomic_store(&g_fake_now, ns); }

/* Test hook: forget a disabled state (and the "said once"), e.g. between test cases. */
DPN_EXPORT void dpro_nccl_trace_test_reset(void) {
  atomic_store(&g_disabled, 0);
  atomic_store(&g_told, 0);
  atomic_store(&g_paused, -1);
  for (int d = 0; d < NDROPS; d++) atomic_store(&g_drops[d].v, 0);
  atomic_store(&g_nmarks, 0);
  pthread_mutex_lock(&g_mutex);
  g_nfiles = 0;
  for (int i = 0; i < DPN_MAX_CTX; i++) g_ctx[i].file = -1;
  pthread_mutex_unlock(&g_mutex);
}

/* At exit (or when NCCL unloads the plugin): write what communicators never finalized. */
__attribute__((destructor)) static void at_exit_flush(void) {
  if (atomic_load(&g_disabled)) return;
  flush_all(1);
}
