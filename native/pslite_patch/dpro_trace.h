/**
 * dpro message trace for ps-lite (header-only; van.cc includes it, see pslite.patch).
 *
 * With PS_TRACE_DIR set, every message this process's Van sends or receives is appended
 * as one JSON line to PS_TRACE_DIR/pslite.<role>.<host>.<pid>.jsonl (format:
 * docs/pslite.md).  Unset, each hook costs one predictable branch on a cached pointer.
 *
 * Cost when on: two clock_gettime, formatting into a stack buffer, a short critical
 * section appending to an in-memory buffer; the buffer is written out (write(2), outside
 * that lock) every kFlushBytes and at Van::Stop / exit.  Lines are whole but not
 * necessarily in time order across threads: readers sort by "ts".
 */
#ifndef PS_DPRO_TRACE_H_
#define PS_DPRO_TRACE_H_

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "ps/internal/message.h"

namespace ps {
namespace dpro_trace {

static const size_t kFlushBytes = 1 << 16;
static const size_t kMaxKeys = 64;  // keys written per line ("nkeys" has the full count)

/** CLOCK_REALTIME in whole microseconds. */
inline long long NowUs() {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000LL + ts.tv_nsec / 1000;
}

inline const char* RoleName(int role) {
  return role == Node::SERVER ? "server" : role == Node::WORKER ? "worker" : "scheduler";
}

inline const char* CmdName(int cmd) {
  static const char* names[] = {"EMPTY", "TERMINATE", "ADD_NODE", "BARRIER", "ACK",
                                "HEARTBEAT", "BOOTSTRAP", "ADDR_REQUEST", "ADDR_RESOLVED"};
  return (cmd >= 0 && cmd < 9) ? names[cmd] : "UNKNOWN";
}

/** The message's kind: push_req, push_res, pull_req, pull_res, control or simple. */
inline const char* Kind(const Meta& m) {
  if (!m.control.empty()) return "control";
  if (m.simple_app) return "simple";
  if (m.push) return m.request ? "push_req" : "push_res";
  return m.request ? "pull_req" : "pull_res";
}

/** A JSON line under construction (fixed buffer; appends past its end are dropped). */
struct Line {
  char buf[2048];
  size_t n = 0;
  Line& S(const char* s) {
    while (*s && n < sizeof(buf)) buf[n++] = *s++;
    return *this;
  }
  Line& U(unsigned long long v) {
    char tmp[24];
    int k = 0;
    do { tmp[k++] = static_cast<char>('0' + v % 10); v /= 10; } while (v);
    while (k && n < sizeof(buf)) buf[n++] = tmp[--k];
    return *this;
  }
  Line& I(long long v) {
    if (v < 0) { S("-"); return U(0ULL - static_cast<unsigned long long>(v)); }
    return U(static_cast<unsigned long long>(v));
  }
  /** a ps-lite id/field; kEmpty (never assigned) is written as null */
  Line& Id(int v) { return v == Meta::kEmpty ? S("null") : I(v); }
};

class Tracer {
 public:
  /** The process's tracer, or nullptr when PS_TRACE_DIR is unset (or unusable). */
  static Tracer* Get() {
    static Tracer* t = Open();  // thread-safe, once; never destroyed (flushed at exit)
    return t;
  }

  /** Append one message record. dir: "send" or "recv"; dur_us: time inside SendMsg. */
  void Record(const char* dir, long long ts, const Node& me, const Message& msg, int bytes,
              long long dur_us) {
    const Meta& m = msg.meta;
    const bool send = dir[0] == 's';
    const int sender = send ? me.id : m.sender;
    const int recver = send ? m.recver : me.id;
    const char* kind = Kind(m);
    Line l;
    l.S("{\"ts\":").I(ts).S(",\"dir\":\"").S(dir).S("\",\"kind\":\"").S(kind);
    l.S("\",\"node\":").Id(me.id).S(",\"role\":\"").S(RoleName(me.role));
    l.S("\",\"sender\":").Id(sender).S(",\"recver\":").Id(recver).S(",\"app\":").Id(m.app_id);
    l.S(",\"customer\":").Id(m.customer_id).S(",\"msg_ts\":").Id(m.timestamp);
    l.S(",\"head\":").Id(m.head).S(",\"seq\":").I(seq_.fetch_add(1, std::memory_order_relaxed));
    l.S(",\"mid\":\"").Id(sender).S(">").Id(recver).S("/").Id(m.app_id).S(".").Id(m.customer_id);
    l.S("/").Id(m.timestamp).S("/").S(kind).S("\",\"wire_bytes\":").I(bytes);
    l.S(",\"dur_us\":").I(dur_us);
    if (!m.control.empty()) {
      l.S(",\"cmd\":\"").S(CmdName(m.control.cmd)).S("\"");
    } else if (!m.simple_app) {
      AppendData(&l, msg);
    }
    l.S("}\n");
    Append(l.buf, l.n);
  }

  /** Write out what is buffered (Van::Stop, exit). */
  void Flush() {
    std::string out;
    {
      std::lock_guard<std::mutex> lk(mu_);
      out.swap(buf_);
    }
    WriteAll(out);
  }

 private:
  explicit Tracer(int fd) : fd_(fd) { buf_.reserve(2 * kFlushBytes); }

  static void FlushAtExit() {
    if (Tracer* t = Get()) t->Flush();
  }

  static Tracer* Open() {
    const char* dir = std::getenv("PS_TRACE_DIR");
    if (dir == nullptr || *dir == '\0') return nullptr;
    mkdir(dir, 0755);  // one level; an existing directory is fine
    char host[256] = "unknown";
    gethostname(host, sizeof(host) - 1);
    const char* role = std::getenv("DMLC_ROLE");
    role = role ? role : "unknown";
    std::string path = std::string(dir) + "/pslite." + role + "." + host + "." +
                       std::to_string(getpid()) + ".jsonl";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "[dpro-trace] cannot open %s: %s; tracing is off\n", path.c_str(),
                   std::strerror(errno));
      return nullptr;
    }
    Tracer* t = new Tracer(fd);
    char head[512];
    int n = std::snprintf(head, sizeof(head),
                          "{\"format\":\"dpro-pslite-trace\",\"version\":1,\"host\":\"%s\","
                          "\"pid\":%d,\"role\":\"%s\",\"clock\":\"CLOCK_REALTIME\","
                          "\"unit\":\"us\",\"t0\":%lld}\n",
                          host, static_cast<int>(getpid()), role, NowUs());
    t->WriteAll(std::string(head, n));
    std::atexit(&Tracer::FlushAtExit);
    return t;
  }

  static void AppendData(Line* l, const Message& msg) {
    const Meta& m = msg.meta;
    long long sz[3] = {0, 0, 0};  // keys, vals, lens
    long long total = 0;
    for (size_t i = 0; i < msg.data.size(); ++i) {
      total += msg.data[i].size();
      if (i < 3) sz[i] = msg.data[i].size();
    }
    l->S(",\"key_bytes\":").I(sz[0]).S(",\"val_bytes\":").I(sz[1]).S(",\"len_bytes\":").I(sz[2]);
    l->S(",\"data_bytes\":").I(total).S(",\"keys\":[");
    size_t nkeys = 0;
    if (!msg.data.empty() && !m.data_type.empty()) {
      const SArray<char>& k = msg.data[0];
      const char* p = k.data();
      const bool k64 = m.data_type[0] == UINT64 || m.data_type[0] == INT64;
      const bool k32 = m.data_type[0] == UINT32 || m.data_type[0] == INT32;
      const size_t w = k64 ? 8 : k32 ? 4 : 0;
      nkeys = w ? k.size() / w : 0;
      for (size_t i = 0; i < nkeys && i < kMaxKeys; ++i) {
        unsigned long long key = 0;
        if (k64) { uint64_t v; std::memcpy(&v, p + i * 8, 8); key = v; }
        else { uint32_t v; std::memcpy(&v, p + i * 4, 4); key = v; }
        if (i) l->S(",");
        l->U(key);
      }
    }
    l->S("],\"nkeys\":").U(nkeys);
  }

  void Append(const char* line, size_t n) {
    std::string out;
    {
      std::lock_guard<std::mutex> lk(mu_);
      buf_.append(line, n);
      if (buf_.size() < kFlushBytes) return;
      out.swap(buf_);
      buf_.reserve(2 * kFlushBytes);
    }
    WriteAll(out);  // outside mu_: other threads keep recording meanwhile
  }

  void WriteAll(const std::string& s) {
    std::lock_guard<std::mutex> lk(io_mu_);  // whole buffers, one at a time
    size_t off = 0;
    while (off < s.size()) {
      ssize_t w = write(fd_, s.data() + off, s.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;  // disk full etc.: drop rather than stall the van
      off += static_cast<size_t>(w);
    }
  }

  int fd_;
  std::mutex mu_;
  std::mutex io_mu_;
  std::string buf_;
  std::atomic<long long> seq_{0};
};

}  // namespace dpro_trace
}  // namespace ps
#endif  // PS_DPRO_TRACE_H_
