// Replicated memory (H2): what copies cost a write and what they buy when a
// node dies. Three real daemons on this machine, a client on node 1:
//   - write latency (median) of 4 KiB and 1 MiB into allocations with 0, 1
//     and 2 copies; baselines in the same run: the same write without
//     copies, direct (memcpy into mapped memory) and through the daemon (the
//     path a replicated write takes, without the copies);
//   - read failover: from the home's SIGKILL until a client on another node
//     reads the allocation again (from a copy), median over trials;
//   - write failover: from a copy's SIGKILL until the home acknowledges a
//     write again (the copy dropped after replication.drop_after_ms).
//
//   replication_bench [--writes N] [--trials N] [--unreachable-ms U]
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Median seconds of `n` writes of `size` bytes at `gva`; negative on error.
double write_median(Client& c, Gva gva, size_t size, int n) {
  std::vector<unsigned char> buf(size, 0x5a);
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    const auto start = Clock::now();
    if (!c.write(gva, buf.data(), size).ok()) return -1;
    t.push_back(seconds_since(start));
  }
  return bench::percentile(t, 0.5);
}

// Seconds until `op` succeeds (polling every 1 ms); negative past 20 s.
template <typename Op>
double until_ok(Op op) {
  const auto start = Clock::now();
  while (seconds_since(start) < 20) {
    if (op()) return seconds_since(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

bool all_healthy(Client& c) {
  return test::health_of(c, 2) == NodeHealth::healthy && test::health_of(c, 3) == NodeHealth::healthy;
}

}  // namespace

int main(int argc, char** argv) {
  int writes = 200, trials = 5, unreachable = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--writes") writes = std::atoi(argv[i + 1]);
    else if (a == "--trials") trials = std::atoi(argv[i + 1]);
    else if (a == "--unreachable-ms") unreachable = std::atoi(argv[i + 1]);
  }
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.cluster_timing = "reconnect_interval_ms = 10\nheartbeat_interval_ms = 10\npeer_timeout_ms = 200\n";
  o.extra_toml = "[health]\nunreachable_after_ms = " + std::to_string(unreachable) +
                 "\n[replication]\nrepair_interval_ms = 20\n";
  test::TestCluster cluster(3, o);
  if (!cluster.ready() || !cluster.wait_connected()) {
    std::fprintf(stderr, "the cluster did not start:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto c = cluster.node(1).connect("replication_bench");
  ClientOptions via;
  via.socket_path = cluster.node(1).socket();
  via.direct_access = false;
  auto through = Client::connect(via);
  if (c == nullptr || !through.ok() || until_ok([&] { return all_healthy(*c); }) < 0) return 1;

  const size_t size = 1 << 20;
  std::vector<Gva> gvas;
  for (uint32_t r = 0; r <= 2; ++r) {
    auto a = c->alloc(size, {.tier = Tier::dram, .replicas = r});
    if (!a.ok()) {
      std::fprintf(stderr, "alloc with %u copies: %s\n", r, a.status().to_string().c_str());
      return 1;
    }
    gvas.push_back(a->gva);
  }
  bench::note("3 daemons on one machine (UCX over shared memory/TCP), client on the home node; medians of " +
              std::to_string(writes) + " writes; baselines: no copies, direct and through the daemon");
  for (size_t bytes : {size_t{4096}, size}) {
    const std::string tag = bytes == size ? "1MiB" : "4KiB";
    const double direct = write_median(*c, gvas[0], bytes, writes);
    const double via_daemon = write_median(**through, gvas[0], bytes, writes);
    const double r1 = write_median(*c, gvas[1], bytes, writes);
    const double r2 = write_median(*c, gvas[2], bytes, writes);
    if (direct < 0 || via_daemon < 0 || r1 < 0 || r2 < 0) return 1;
    bench::figure("write_" + tag + "_direct_us", direct * 1e6, "us");
    bench::figure("write_" + tag + "_through_daemon_us", via_daemon * 1e6, "us");
    bench::figure("write_" + tag + "_replicas1_us", r1 * 1e6, "us");
    bench::figure("write_" + tag + "_replicas2_us", r2 * 1e6, "us");
    bench::ratio("write_" + tag + "_replicas1_vs_direct", direct / r1);
    bench::ratio("write_" + tag + "_replicas1_vs_through_daemon", via_daemon / r1);
    bench::ratio("write_" + tag + "_replicas2_vs_replicas1", r1 / r2);
  }

  // Read failover: the home dies; a reader on node 2 reads again from a copy.
  std::vector<double> read_over, write_over;
  std::vector<unsigned char> buf(4096);
  for (int t = 0; t < trials; ++t) {
    if (until_ok([&] { return all_healthy(*c); }) < 0) return 1;
    auto reader = cluster.node(2).connect("reader");
    if (!reader->read(gvas[1], buf.data(), buf.size()).ok()) return 1;
    cluster.node(1).kill();
    const auto start = Clock::now();
    if (until_ok([&] { return reader->read(gvas[1], buf.data(), buf.size()).ok(); }) < 0) return 1;
    read_over.push_back(seconds_since(start));
    if (!cluster.node(1).restart()) return 1;
    c = cluster.node(1).connect("replication_bench");
  }
  // Write failover: a copy's node dies; the home writes on without it.
  for (int t = 0; t < trials; ++t) {
    if (until_ok([&] { return all_healthy(*c); }) < 0) return 1;
    auto info = c->translate(gvas[1]);
    if (!info.ok() || info->allocation.replicas.empty()) return 1;
    const int holder = static_cast<int>(info->allocation.replicas.back().node);
    cluster.node(holder).kill();
    const auto start = Clock::now();
    if (until_ok([&] { return c->write(gvas[1], buf.data(), buf.size()).ok(); }) < 0) return 1;
    write_over.push_back(seconds_since(start));
    if (!cluster.node(holder).restart()) return 1;
  }
  const double drop_after = 2.0 * unreachable;
  bench::note(std::to_string(trials) + " trials; heartbeats every 10 ms, unreachable after " +
              std::to_string(unreachable) + " ms, copies of a silent node dropped after " + std::to_string(int(drop_after)) + " ms of silence (of a killed one at once)");
  bench::figure("read_failover_ms_p50", bench::percentile(read_over, 0.5) * 1e3, "ms");
  bench::figure("write_failover_ms_p50", bench::percentile(write_over, 0.5) * 1e3, "ms");
  bench::ratio("write_failover_p50_vs_drop_after", bench::percentile(write_over, 0.5) * 1e3 / drop_after);
  return 0;
}
