/*
 * NCCL profiler-plugin interface, as much of it as dpro's plugin needs: declared here
 * for dpro from NCCL's documentation of the interface (NVIDIA/nccl,
 * plugins/profiler/README.md, formerly ext-profiler/README.md) and the public result
 * codes of nccl.h (nvidia-nccl-cu13 2.32.3). Only the ABI matters to NCCL: the symbol
 * names ncclProfiler_v3 .. ncclProfiler_v6, the order and types of each struct's fields
 * and the function signatures. The type names below are dpro's own.
 *
 *   interface   first NCCL   what changed (for us)
 *   v3          2.26         init(ctx, mask); descriptor type is uint8_t; coll has name+commHash
 *   v4          2.27         init gets comm name/hash, nNodes, nranks, rank, logger;
 *                            kernelCh gets a GPU timer (pTimer); new states 19, 20
 *   v5          2.28         descriptor type is uint64_t; API events (groupApi, collApi, ...)
 *                            added before the old members; init's commId moves to arg 2
 *   v6          2.29         v5 plus copy-engine (CE) collective events; same functions
 *
 * Nothing here is needed at run time but the ABI: no NCCL header is included.
 */
#ifndef DPRO_NCCL_API_H_
#define DPRO_NCCL_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Result codes (values as in nccl.h). Profiler callbacks only ever return success; init
 * may fail, and NCCL then goes on without the plugin. */
typedef enum {
  DPN_NCCL_SUCCESS = 0,
  DPN_NCCL_SYSTEM_ERROR = 2,
  DPN_NCCL_INTERNAL_ERROR = 3,
} dpn_result_t;

/* The logger NCCL hands to init (v4+): level, subsystem flags, file, line, printf format. */
typedef void (*dpn_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
#define DPN_LOG_INFO 3
#define DPN_LOG_SUBSYS_INIT 1

/* Event types: bits of the activation mask and values of the descriptor's `type`. */
enum {
  DPN_EV_GROUP = 1 << 0,
  DPN_EV_COLL = 1 << 1,
  DPN_EV_P2P = 1 << 2,
  DPN_EV_PROXY_OP = 1 << 3,
  DPN_EV_PROXY_STEP = 1 << 4,
  DPN_EV_PROXY_CTRL = 1 << 5,
  DPN_EV_KERNEL_CH = 1 << 6,
  DPN_EV_NET_PLUGIN = 1 << 7,
  DPN_EV_GROUP_API = 1 << 8,   /* v5+ */
  DPN_EV_COLL_API = 1 << 9,    /* v5+ */
  DPN_EV_P2P_API = 1 << 10,    /* v5+ */
  DPN_EV_KERNEL_LAUNCH = 1 << 11, /* v5+ */
  DPN_EV_CE_COLL = 1 << 12,    /* v6 */
  DPN_EV_CE_SYNC = 1 << 13,    /* v6 */
  DPN_EV_CE_BATCH = 1 << 14,   /* v6 */
};

/* State transitions passed to recordEventState (one enum for every version). */
enum {
  DPN_ST_PROXY_OP_IN_PROGRESS = 19,    /* v4+: the proxy starts progressing the op */
  DPN_ST_STEP_SEND_GPU_WAIT = 8,       /* send buffer posted; waiting for the GPU's data */
  DPN_ST_STEP_SEND_PEER_WAIT = 20,     /* v4+: data ready; waiting for the receiver's credit */
  DPN_ST_STEP_SEND_WAIT = 9,           /* isend posted; on the network */
  DPN_ST_STEP_RECV_WAIT = 10,          /* irecv posted; waiting for the data */
  DPN_ST_STEP_RECV_FLUSH_WAIT = 11,    /* data arrived; flushing it to the GPU */
  DPN_ST_STEP_RECV_GPU_WAIT = 12,      /* data visible to the GPU; waiting for it to be consumed */
  DPN_ST_KERNEL_CH_STOP = 22,          /* kernel channel finished (args carry its GPU timer) */
};

/* Attributes that come with a state transition. Every member we read sits at offset 0. */
typedef union {
  struct { size_t transSize; } proxyStep;      /* v4+ (v3: proxyOp.transSize, same offset) */
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void* data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;        /* v4+ */
} dpn_state_args_t;

/* ---- event descriptors ------------------------------------------------------------ */

/* Members shared by all versions (the layout of each is fixed by its position). */
typedef struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } dpn_proxy_op_descr_t;
typedef struct { int step; } dpn_proxy_step_descr_t;
typedef struct { int64_t id; void* data; } dpn_net_plugin_descr_t;

/* v3 (NCCL 2.26) */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* name; uint64_t commHash; uint64_t seqNumber; const char* func;
      const void* sendBuff; void* recvBuff; size_t count; int root; const char* datatype;
      uint8_t nMaxChannels; uint8_t nWarps; const char* algo; const char* proto;
    } coll;
    struct {
      const char* name; uint64_t commHash; const char* func; void* buff; const char* datatype;
      size_t count; int peer;
    } p2p;
    dpn_proxy_op_descr_t proxyOp;
    dpn_proxy_step_descr_t proxyStep;
    struct { uint8_t channelId; } kernelCh;
    dpn_net_plugin_descr_t netPlugin;
  };
} dpn_descr_v3_t;

/* v4 (NCCL 2.27) */
typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count;
      int root; const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto;
    } coll;
    struct {
      const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels;
    } p2p;
    dpn_proxy_op_descr_t proxyOp;
    dpn_proxy_step_descr_t proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    dpn_net_plugin_descr_t netPlugin;
  };
} dpn_descr_v4_t;

/* v5 (NCCL 2.28) and v6 (2.29+: the same members plus copy-engine ones, which we ignore;
 * the union only grows, so every member we read keeps its offset). */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct { bool graphCaptured; int groupDepth; } groupApi;
    struct { const char* func; size_t count; const char* datatype; int root; void* stream; bool graphCaptured; } collApi;
    struct { const char* func; size_t count; const char* datatype; void* stream; bool graphCaptured; } p2pApi;
    struct { void* stream; } kernelLaunch;
    struct {
      uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count;
      int root; const char* datatype; uint8_t nChannels; uint8_t nWarps; const char* algo; const char* proto;
      void* parentGroup;
    } coll;
    struct {
      const char* func; void* buff; const char* datatype; size_t count; int peer; uint8_t nChannels;
      void* parentGroup;
    } p2p;
    dpn_proxy_op_descr_t proxyOp;
    dpn_proxy_step_descr_t proxyStep;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    dpn_net_plugin_descr_t netPlugin;
    /* v6 only: CE collective (the largest member; declared so the union has v6's size) */
    struct {
      uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff; size_t count;
      int root; const char* datatype; const char* syncStrategy; bool intraBatchSync;
      uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum; void* stream;
    } ceColl;
  };
} dpn_descr_v5_t;

typedef dpn_descr_v5_t dpn_descr_v6_t;

/* ---- the exported structs NCCL looks up by symbol name ---------------------------- */

typedef struct {
  const char* name;
  dpn_result_t (*init)(void** context, int* eActivationMask);
  dpn_result_t (*startEvent)(void* context, void** eHandle, dpn_descr_v3_t* eDescr);
  dpn_result_t (*stopEvent)(void* eHandle);
  dpn_result_t (*recordEventState)(void* eHandle, int eState, dpn_state_args_t* eStateArgs);
  dpn_result_t (*finalize)(void* context);
} dpn_profiler_v3_t;

typedef struct {
  const char* name;
  dpn_result_t (*init)(void** context, int* eActivationMask, const char* commName, uint64_t commHash,
                       int nNodes, int nranks, int rank, dpn_logger_t logfn);
  dpn_result_t (*startEvent)(void* context, void** eHandle, dpn_descr_v4_t* eDescr);
  dpn_result_t (*stopEvent)(void* eHandle);
  dpn_result_t (*recordEventState)(void* eHandle, int eState, dpn_state_args_t* eStateArgs);
  dpn_result_t (*finalize)(void* context);
} dpn_profiler_v4_t;

typedef struct {
  const char* name;
  dpn_result_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, dpn_logger_t logfn);
  dpn_result_t (*startEvent)(void* context, void** eHandle, dpn_descr_v5_t* eDescr);
  dpn_result_t (*stopEvent)(void* eHandle);
  dpn_result_t (*recordEventState)(void* eHandle, int eState, dpn_state_args_t* eStateArgs);
  dpn_result_t (*finalize)(void* context);
} dpn_profiler_v5_t;

typedef dpn_profiler_v5_t dpn_profiler_v6_t;

#endif /* DPRO_NCCL_API_H_ */
