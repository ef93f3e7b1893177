// Daemons of one host (issue 29): a client of node 1 reading and writing
// memory homed on node 2, whose daemon runs on the same host, mapped from the
// files node 2's daemon hands it — against the baseline of the same calls on
// node 1's own memory, measured in the same process, turn by turn (the
// median of 5 rounds each). Also with a busy loop on each core beside it (a
// trainer computing). Goals: 64 KiB and above >= 0.9 of the baseline, 4 KiB
// >= 0.5, an 8-byte read <= 1 us, coherent fetch-add >= 10 M/s (issue 52;
// beside it a bare CPU atomic's rate, the anchor).
// Usage: same_host_bench   (starts its own two daemons; TIERMEMD names the binary)
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20};
constexpr int k_rounds = 5;

int iterations(size_t size) { return static_cast<int>(std::max<size_t>(16, std::min<size_t>(4000, (256u << 20) / size))); }

// Bytes per second of `n` calls of `fn`.
template <typename Fn>
double rate(size_t bytes, int n, Fn&& fn) {
  const double start = bench::now_seconds();
  for (int i = 0; i < n; ++i) fn();
  return static_cast<double>(bytes) * n / (bench::now_seconds() - start);
}

struct Target {
  Gva region, counter;
};

struct Figures {
  std::vector<double> put[4], get[4], read8, fadd, bare;
};

void measure(Client& c, const Target& t, std::vector<char>& buf, Figures* f) {
  for (size_t k = 0; k < 4; ++k) {
    const size_t size = k_sizes[k];
    const int n = iterations(size);
    (void)c.write(t.region, buf.data(), size);
    f->put[k].push_back(rate(size, n, [&] { (void)c.write(t.region, buf.data(), size); }));
    f->get[k].push_back(rate(size, n, [&] { (void)c.read(t.region, buf.data(), size); }));
  }
  std::vector<double> lat;
  uint64_t word = 0;
  for (int i = 0; i < 4000; ++i) {
    const double t0 = bench::now_seconds();
    (void)c.read(t.region, &word, 8);
    lat.push_back(bench::now_seconds() - t0);
  }
  f->read8.push_back(bench::percentile(lat, 0.5));
  constexpr int k_adds = 100000;
  (void)c.fetch_add(t.counter, 1);
  f->fadd.push_back(rate(1, k_adds, [&] { (void)c.fetch_add(t.counter, 1); }));
  // The anchor: the same adds as bare CPU atomics on a word of this process.
  static std::atomic<uint64_t> bare{0};
  f->bare.push_back(rate(1, k_adds, [&] { bare.fetch_add(1); }));
}

void report(const std::string& tag, const Figures& host, const Figures& local) {
  for (size_t k = 0; k < 4; ++k) {
    const std::string s = std::to_string(k_sizes[k] >> 10) + "KiB";
    for (bool put : {true, false}) {
      const double ours = bench::median(put ? host.put[k] : host.get[k]);
      const double base = bench::median(put ? local.put[k] : local.get[k]);
      const std::string what = std::string(put ? "write" : "read") + "_" + s + tag;
      bench::figure("same_host_" + what, ours / 1e6, "MB/s");
      bench::figure("own_node_" + what, base / 1e6, "MB/s");
      bench::ratio("same_host_" + what + "_vs_own_node", ours / base);
    }
  }
  bench::figure("same_host_read_8B_p50" + tag, bench::median(host.read8) * 1e6, "us");
  bench::figure("own_node_read_8B_p50" + tag, bench::median(local.read8) * 1e6, "us");
  bench::figure("same_host_fadd_coherent" + tag, bench::median(host.fadd), "ops/s");
  bench::figure("own_node_fadd_coherent" + tag, bench::median(local.fadd), "ops/s");
  bench::ratio("same_host_fadd_coherent" + tag + "_vs_own_node", bench::median(host.fadd) / bench::median(local.fadd));
  bench::figure("bare_cpu_fadd" + tag, bench::median(host.bare), "ops/s");
  bench::ratio("same_host_fadd_coherent" + tag + "_vs_bare_cpu", bench::median(host.fadd) / bench::median(host.bare));
}

}  // namespace

int main() {
  test::DaemonOptions o;
  o.dram = "512MiB";
  o.pmem = "8MiB";
  test::TestCluster cluster(2, o);
  if (!cluster.ready() || !cluster.wait_connected()) {
    std::fprintf(stderr, "cluster did not start:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto client = cluster.node(1).connect("same_host_bench");
  Target host, local;
  for (auto [t, node] : {std::pair{&host, NodeId{2}}, std::pair{&local, NodeId{1}}}) {
    auto region = client->alloc(16 << 20, {.tier = Tier::dram, .node = node});
    auto counter = client->alloc(64, {.tier = Tier::dram, .node = node, .coherent = true});
    if (!region.ok() || !counter.ok()) {
      std::fprintf(stderr, "alloc on node %u failed\n", static_cast<unsigned>(node));
      return 1;
    }
    t->region = region->gva;
    t->counter = counter->gva;
  }
  std::vector<char> buf(16 << 20, 'x');
  (void)client->write(host.region, buf.data(), 8);
  const AccessCounters before = client->access_counters();
  bench::note("client on node 1; memory on node 2 (its daemon on this host, mapped) against node 1's own; "
              "medians of " + std::to_string(k_rounds) + " rounds, one call at a time");
  for (bool loaded : {false, true}) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> burners;
    if (loaded) {
      for (unsigned i = 0; i < std::thread::hardware_concurrency(); ++i) {
        burners.emplace_back([&stop] {
          volatile uint64_t x = 0;
          while (!stop.load(std::memory_order_relaxed)) x = x + 1;
        });
      }
    }
    Figures h, l;
    for (int r = 0; r < k_rounds; ++r) {
      measure(*client, host, buf, &h);
      measure(*client, local, buf, &l);
    }
    stop = true;
    for (auto& b : burners) b.join();
    report(loaded ? "_loaded" : "", h, l);
  }
  const AccessCounters after = client->access_counters();
  // Every call to node 2 went straight to its mapped memory.
  bench::figure("same_host_calls_through_daemon", static_cast<double>(after.through_daemon - before.through_daemon),
                "calls");
  return 0;
}
