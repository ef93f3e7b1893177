// Control plane: alloc+free pairs per second and translate round-trip latency
// over the daemon's Unix socket, against a bare Unix-socket echo round trip of
// a frame of the same size measured in the same process. And the cost of
// durability (H5): alloc+free pairs of a daemon recording them in its
// metadata pool (on /dev/shm, and on a plain file of the disk) against one
// without metadata, in alternating rounds of the same run.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
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

// alloc+free pairs per second over `n` pairs; 0 on failure.
double pairs_rate(Client& client, int n) {
  const double start = bench::now_seconds();
  for (int i = 0; i < n; ++i) {
    auto a = client.alloc(4096, {.tier = Tier::dram});
    if (!a.ok() || !client.free(a->gva).ok()) {
      std::fprintf(stderr, "alloc/free failed\n");
      return 0;
    }
  }
  return n / (bench::now_seconds() - start);
}

}  // namespace

int main() {
  const test::DaemonOptions base{.dram = "256MiB", .pmem = "8MiB", .page_size = "64KiB"};
  test::TestDaemon daemon(base);
  test::DaemonOptions volatile_options = base, disk_options = base;
  volatile_options.extra_toml = "[metadata]\nenabled = false\n";
  const std::string disk_dir = test::make_temp_dir_in("/var/tmp", "tiermem-bench-meta");
  disk_options.extra_toml = "[metadata]\npath = \"" + disk_dir + "/metadata.pool\"\n";
  test::TestDaemon volatile_daemon(volatile_options), disk_daemon(disk_options);
  for (test::TestDaemon* d : {&daemon, &volatile_daemon, &disk_daemon}) {
    if (!d->ready()) {
      std::fprintf(stderr, "tiermemd did not start:\n%s\n", d->log().c_str());
      return 1;
    }
  }
  auto client = daemon.connect("control_plane_bench");
  auto volatile_client = volatile_daemon.connect("control_plane_bench");
  auto disk_client = disk_daemon.connect("control_plane_bench");
  constexpr int k_pairs = 1000, k_rounds = 5;
  constexpr int k_translates = 20000;

  for (Client* c : {client.get(), volatile_client.get(), disk_client.get()}) (void)pairs_rate(*c, 200);  // warm up
  std::vector<double> durable, forgetful, on_disk;
  for (int r = 0; r < k_rounds; ++r) {
    durable.push_back(pairs_rate(*client, k_pairs));
    forgetful.push_back(pairs_rate(*volatile_client, k_pairs));
    on_disk.push_back(pairs_rate(*disk_client, k_pairs / 10));
  }
  for (const auto* v : {&durable, &forgetful, &on_disk}) {
    if (std::find(v->begin(), v->end(), 0.0) != v->end()) return 1;
  }
  const double pairs_per_s = bench::percentile(durable, 0.5);
  const double volatile_per_s = bench::percentile(forgetful, 0.5);
  const double disk_per_s = bench::percentile(on_disk, 0.5);
  std::filesystem::remove_all(disk_dir);

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
  bench::note("page size 64 KiB; medians of " + std::to_string(k_rounds) + " rounds of " + std::to_string(k_pairs) +
              " alloc+free pairs (a tenth of that with the pool on disk), " + std::to_string(k_translates) +
              " translates; baselines: the same daemon without metadata, a bare Unix-socket echo of 256 bytes");
  bench::figure("alloc_free_pairs_rate", pairs_per_s, "pairs/s");
  bench::figure("alloc_free_pairs_rate_without_metadata", volatile_per_s, "pairs/s");
  bench::figure("alloc_free_pairs_rate_metadata_on_disk", disk_per_s, "pairs/s");
  bench::ratio("alloc_free_durable_vs_without_metadata", pairs_per_s / volatile_per_s);
  bench::ratio("alloc_free_durable_on_disk_vs_without_metadata", disk_per_s / volatile_per_s);
  bench::figure("translate_rtt_p50", bench::percentile(rtt, 0.5) * 1e6, "us");
  bench::figure("translate_rtt_p99", bench::percentile(rtt, 0.99) * 1e6, "us");
  bench::figure("socket_echo_rtt_p50", bench::percentile(echo, 0.5) * 1e6, "us");
  bench::figure("socket_echo_rtt_p99", bench::percentile(echo, 0.99) * 1e6, "us");
  bench::ratio("translate_rtt_p50_vs_socket_echo", bench::percentile(rtt, 0.5) / bench::percentile(echo, 0.5));
  return 0;
}
