// Failure detection (H1): how long until a daemon's view of a peer turns
// UNREACHABLE after the peer is stopped (SIGSTOP: nothing tells anyone) and
// after it is killed (SIGKILL: the kernel refuses the next connection), over
// many trials, with heartbeats every INTERVAL ms. The baseline is the
// heartbeat interval itself (ratio), and for SIGSTOP the configured bound
// (unreachable_after + one check).
//
//   health_bench [--trials N] [--interval-ms I] [--unreachable-ms U]
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;
using Clock = std::chrono::steady_clock;

namespace {

// Seconds until node 1 sees node 3 as `want`; negative past `limit`.
double until(Client& c, NodeHealth want, double limit) {
  const auto start = Clock::now();
  for (;;) {
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (test::health_of(c, 3) == want) return t;
    if (t > limit) return -1;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 20, interval = 10, unreachable = 100;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--trials") trials = std::atoi(argv[i + 1]);
    else if (a == "--interval-ms") interval = std::atoi(argv[i + 1]);
    else if (a == "--unreachable-ms") unreachable = std::atoi(argv[i + 1]);
  }
  const int timeout = 5 * interval;
  test::DaemonOptions o;
  o.page_size = "64KiB";
  o.cluster_timing = "reconnect_interval_ms = " + std::to_string(interval) + "\nheartbeat_interval_ms = " +
                     std::to_string(interval) + "\npeer_timeout_ms = " + std::to_string(timeout) + "\n";
  o.extra_toml = "[health]\nunreachable_after_ms = " + std::to_string(unreachable) + "\n";
  test::TestCluster cluster(3, o);
  if (!cluster.ready() || !cluster.wait_connected()) {
    std::fprintf(stderr, "the cluster did not start:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto c = cluster.node(1).connect("health_bench");
  // What went wrong, with what node 1 saw last and the daemons' logs.
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "health_bench: %s (node 1 sees node 3 as %d)\n%s\n", what.c_str(),
                 static_cast<int>(test::health_of(*c, 3)), cluster.logs().c_str());
    return 1;
  };
  std::vector<double> stop_s, kill_s;
  for (int t = 0; t < trials; ++t) {
    if (until(*c, NodeHealth::healthy, 10) < 0) return fail("node 3 not healthy again 10 s after SIGCONT, trial " + std::to_string(t));
    ::kill(cluster.node(3).pid(), SIGSTOP);
    stop_s.push_back(until(*c, NodeHealth::unreachable, 10));
    ::kill(cluster.node(3).pid(), SIGCONT);
  }
  for (int t = 0; t < trials; ++t) {
    if (until(*c, NodeHealth::healthy, 10) < 0) return fail("node 3 not healthy 10 s after its restart, trial " + std::to_string(t));
    cluster.node(3).kill();
    kill_s.push_back(until(*c, NodeHealth::unreachable, 10));
    if (!cluster.node(3).restart()) return fail("node 3 did not start again, trial " + std::to_string(t));
  }
  for (const auto* v : {&stop_s, &kill_s}) {
    for (double x : *v) {
      if (x < 0) {
        return fail("a trial never saw the node unreachable");
      }
    }
  }
  const double ms = 1e3;
  bench::note(std::to_string(trials) + " trials each; heartbeats every " + std::to_string(interval) +
              " ms, peer timeout " + std::to_string(timeout) + " ms, unreachable after " + std::to_string(unreachable) +
              " ms; baseline: the heartbeat interval");
  bench::figure("detect_sigstop_ms_p50", bench::percentile(stop_s, 0.5) * ms, "ms");
  bench::figure("detect_sigstop_ms_p99", bench::percentile(stop_s, 0.99) * ms, "ms");
  bench::figure("detect_sigkill_ms_p50", bench::percentile(kill_s, 0.5) * ms, "ms");
  bench::figure("detect_sigkill_ms_p99", bench::percentile(kill_s, 0.99) * ms, "ms");
  bench::ratio("detect_sigstop_p50_vs_heartbeat_interval", bench::percentile(stop_s, 0.5) * ms / interval);
  bench::ratio("detect_sigkill_p50_vs_heartbeat_interval", bench::percentile(kill_s, 0.5) * ms / interval);
  bench::ratio("detect_sigstop_p99_vs_bound",
               bench::percentile(stop_s, 0.99) * ms / (unreachable + interval + timeout));
  return 0;
}
