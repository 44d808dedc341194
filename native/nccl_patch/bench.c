/*
 * Cost of dpro's NCCL profiler callbacks, called the way NCCL's proxy thread calls them
 * for one network step: startEvent, three recordEventState, stopEvent (5 callbacks = one
 * step record). Loads the plugin with dlopen and calls it through the exported
 * ncclProfiler_v5 struct, as NCCL does. Prints one human line per case and a final JSON
 * line (for benchmarks/nccl_plugin_overhead.py).
 *
 *   bench [PLUGIN.so] [STEPS] [OUTDIR]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dpro_nccl_api.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* one collective with one proxy op of `steps` network steps; returns seconds spent in
 * the step callbacks only */
static double run(const dpn_profiler_v5_t* p, void* ctx, long steps, int send) {
  dpn_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = DPN_EV_COLL;
  d.coll.func = "AllReduce";
  d.coll.datatype = "ncclFloat32";
  d.coll.algo = "RING";
  d.coll.proto = "SIMPLE";
  d.coll.count = 1 << 20;
  d.coll.nChannels = 1;
  void* coll = NULL;
  p->startEvent(ctx, &coll, &d);
  p->stopEvent(coll);
  memset(&d, 0, sizeof d);
  d.type = DPN_EV_PROXY_OP;
  d.parentObj = coll;
  d.proxyOp.pid = getpid();
  d.proxyOp.peer = 1;
  d.proxyOp.nSteps = (int)steps;
  d.proxyOp.chunkSize = 1 << 19;
  d.proxyOp.isSend = send;
  void* op = NULL;
  p->startEvent(ctx, &op, &d);
  dpn_state_args_t a;
  memset(&a, 0, sizeof a);
  a.proxyStep.transSize = 1 << 19;
  int s1 = send ? DPN_ST_STEP_SEND_GPU_WAIT : DPN_ST_STEP_RECV_WAIT;
  int s2 = send ? DPN_ST_STEP_SEND_PEER_WAIT : DPN_ST_STEP_RECV_FLUSH_WAIT;
  int s3 = send ? DPN_ST_STEP_SEND_WAIT : DPN_ST_STEP_RECV_GPU_WAIT;
  double t0 = now_s();
  for (long i = 0; i < steps; i++) {
    dpn_descr_v5_t sd;
    sd.type = DPN_EV_PROXY_STEP;
    sd.parentObj = op;
    sd.rank = 0;
    sd.proxyStep.step = (int)i;
    void* h = NULL;
    p->startEvent(ctx, &h, &sd);
    p->recordEventState(h, s1, &a);
    p->recordEventState(h, s2, &a);
    p->recordEventState(h, s3, &a);
    p->stopEvent(h);
  }
  double t = now_s() - t0;
  p->stopEvent(op);
  return t;
}

int main(int argc, char** argv) {
  const char* lib = argc > 1 ? argv[1] : "build/libnccl-profiler-dpro.so";
  long steps = argc > 2 ? atol(argv[2]) : 1000000;
  const char* dir = argc > 3 ? argv[3] : "/tmp/dpro-nccl-bench";
  if (steps < 1) steps = 1;
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "bench: %s\n", dlerror()); return 2; }
  const dpn_profiler_v5_t* p = (const dpn_profiler_v5_t*)dlsym(h, "ncclProfiler_v5");
  if (!p) { fprintf(stderr, "bench: no ncclProfiler_v5 in %s\n", lib); return 2; }

  /* 1. tracing on: every step recorded (first touch of the record pages included) */
  char cap[32];
  snprintf(cap, sizeof cap, "%ld", steps);
  setenv("DPRO_NCCL_TRACE_DIR", dir, 1);
  setenv("DPRO_NCCL_TRACE_EVENTS", cap, 1);
  void* ctx = NULL;
  int mask = 0;
  p->init(&ctx, 0x1234, &mask, "bench", 1, 2, 0, NULL);
  if (!ctx) { fprintf(stderr, "bench: the plugin did not initialise\n"); return 2; }
  double t_on = run(p, ctx, steps, 1);
  /* 2. buffer full: the same calls once every record is taken (counted drops) */
  double t_full = run(p, ctx, steps, 0);
  double t_w0 = now_s();
  p->finalize(ctx);
  double t_write = now_s() - t_w0;

  /* 3. tracing off (no DPRO_NCCL_TRACE_DIR): NCCL still calls us if another comm traces */
  unsetenv("DPRO_NCCL_TRACE_DIR");
  void* off = NULL;
  p->init(&off, 0x5678, &mask, "bench-off", 1, 2, 0, NULL);
  double t_off = run(p, off, steps, 1);

  /* 4. the clock alone (5 reads per step record) */
  struct timespec ts;
  unsigned long long sink = 0;
  double t_c0 = now_s();
  for (long i = 0; i < steps; i++) {
    clock_gettime(CLOCK_REALTIME, &ts);
    sink += (unsigned long long)ts.tv_nsec;
  }
  double per_clock = 1e9 * (now_s() - t_c0) / (double)steps + 0 * (double)(sink & 1);

  double per_on = 1e9 * t_on / (double)steps, per_full = 1e9 * t_full / (double)steps;
  double per_off = 1e9 * t_off / (double)steps, per_write = 1e9 * t_write / (double)steps;
  printf("steps: %ld (5 callbacks each: start, 3 x record, stop)\n", steps);
  printf("tracing:      %7.1f ns per step record, %6.1f ns per callback\n", per_on, per_on / 5);
  printf("buffer full:  %7.1f ns per step (dropped), %6.1f ns per callback\n", per_full, per_full / 5);
  printf("not tracing:  %7.1f ns per step, %6.1f ns per callback\n", per_off, per_off / 5);
  printf("clock:        %7.1f ns per clock_gettime(CLOCK_REALTIME) (4-5 per step record)\n", per_clock);
  printf("finalize:     %7.1f ns per record written (JSON lines, off the hot path)\n", per_write);
  printf("{\"steps\":%ld,\"ns_per_step\":%.2f,\"ns_per_callback\":%.2f,\"ns_per_step_full\":%.2f,"
         "\"ns_per_step_off\":%.2f,\"ns_per_record_written\":%.2f,\"ns_per_clock_read\":%.2f}\n",
         steps, per_on, per_on / 5, per_full, per_off, per_write, per_clock);
  return 0;
}
