// Cost of dpro's ps-lite trace hook per message (benchmarks/pslite_overhead.py builds and
// runs this).  Times what Van::Send / Van::Receiving add: Tracer::Get() and, when on, two
// clock reads plus Record() of a push request (1 key, 3 data blobs), N times on T threads.
// Prints one JSON line: {"threads":T,"messages":N,"ns_per_message":...,"enabled":0|1}.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ps/base.h"
#include "ps/internal/message.h"
#include "dpro_trace.h"

int main(int argc, char** argv) {
  using namespace ps;
  const long n = argc > 1 ? atol(argv[1]) : 1000000;
  const int threads = argc > 2 ? atoi(argv[2]) : 1;
  Node me;
  me.id = 9;
  me.role = Node::WORKER;
  Message msg;
  msg.meta.app_id = 0;
  msg.meta.customer_id = 0;
  msg.meta.request = true;
  msg.meta.push = true;
  msg.meta.head = 0;
  msg.meta.recver = 8;
  msg.meta.val_len = 4096;
  SArray<Key> keys(1, 42);
  SArray<char> vals(4096, 1);
  SArray<int> lens(1, 4096);
  msg.AddData(keys);
  msg.AddData(vals);
  msg.AddData(lens);
  auto work = [&](int t) {
    Message m = msg;
    for (long i = t; i < n; i += threads) {
      m.meta.timestamp = static_cast<int>(i);
      dpro_trace::Tracer* tr = dpro_trace::Tracer::Get();
      long long t0 = tr ? dpro_trace::NowUs() : 0;
      if (tr) tr->Record("send", t0, me, m, 4208, dpro_trace::NowUs() - t0);
    }
  };
  auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(work, t);
  for (auto& t : ts) t.join();
  if (dpro_trace::Tracer* tr = dpro_trace::Tracer::Get()) tr->Flush();
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
  std::printf("{\"threads\":%d,\"messages\":%ld,\"ns_per_message\":%.1f,\"enabled\":%d}\n", threads, n,
              ns / n, dpro_trace::Tracer::Get() ? 1 : 0);
  return 0;
}
