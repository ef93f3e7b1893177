// Control plane: alloc+free pairs per second and translate round-trip latency
// over the daemon's Unix socket, against a bare Unix-socket echo round trip of
// a frame of the same size measured in the same process.
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

// Round trips of `bytes` over a socketpair to an echoing thread, in seconds.
std::vector<double> echo_round_trips(size_t bytes, int n) {
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  std::thread echo([fd = sv[1], bytes, n] {
    std::vector<char> buf(bytes);
    for (int i = 0; i < n; ++i) {
      size_t got = 0;
      while (got < bytes) got += static_cast<size_t>(::read(fd, buf.data() + got, bytes - got));
      (void)::write(fd, buf.data(), bytes);
    }
  });
  std::vector<char> buf(bytes, 'x');
  std::vector<double> times;
  for (int i = 0; i < n; ++i) {
    const double start = bench::now_seconds();
    (void)::write(sv[0], buf.data(), bytes);
    size_t got = 0;
    while (got < bytes) got += static_cast<size_t>(::read(sv[0], buf.data() + got, bytes - got));
    times.push_back(bench::now_seconds() - start);
  }
  echo.join();
  ::close(sv[0]);
  ::close(sv[1]);
  return times;
}

}  // namespace

int main() {
  test::TestDaemon daemon({.dram = "256MiB", .pmem = "8MiB", .page_size = "64KiB"});
  if (!daemon.ready()) {
    std::fprintf(stderr, "tiermemd did not start:\n%s\n", daemon.log().c_str());
    return 1;
  }
  auto client = daemon.connect("control_plane_bench");
  constexpr int k_pairs = 5000;
  constexpr int k_translates = 20000;

  for (int i = 0; i < 200; ++i) (void)client->free(client->alloc(4096)->gva);  // warm up
  const double start = bench::now_seconds();
  for (int i = 0; i < k_pairs; ++i) {
    auto a = client->alloc(4096, {.tier = Tier::dram});
    if (!a.ok() || !client->free(a->gva).ok()) {
      std::fprintf(stderr, "alloc/free failed\n");
      return 1;
    }
  }
  const double pairs_per_s = k_pairs / (bench::now_seconds() - start);

  auto target = client->alloc(1 << 20);
  std::vector<double> rtt;
  for (int i = 0; i < k_translates; ++i) {
    const double t0 = bench::now_seconds();
    auto t = client->translate(target->gva.plus(static_cast<uint64_t>(i) % (1 << 20)));
    rtt.push_back(bench::now_seconds() - t0);
    if (!t.ok()) return 1;
  }
  // A translate request is ~40 bytes and its response ~200: echo 256 bytes.
  const auto echo = echo_round_trips(256, k_translates);
  bench::note("page size 64 KiB; " + std::to_string(k_pairs) + " alloc+free pairs, " +
              std::to_string(k_translates) + " translates; baseline: bare Unix-socket echo of 256 bytes");
  bench::figure("alloc_free_pairs_rate", pairs_per_s, "pairs/s");
  bench::figure("translate_rtt_p50", bench::percentile(rtt, 0.5) * 1e6, "us");
  bench::figure("translate_rtt_p99", bench::percentile(rtt, 0.99) * 1e6, "us");
  bench::figure("socket_echo_rtt_p50", bench::percentile(echo, 0.5) * 1e6, "us");
  bench::figure("socket_echo_rtt_p99", bench::percentile(echo, 0.99) * 1e6, "us");
  bench::ratio("translate_rtt_p50_vs_socket_echo", bench::percentile(rtt, 0.5) / bench::percentile(echo, 0.5));
  return 0;
}
