// Control plane: alloc+free pairs per second and translate round-trip latency
// over the daemon's Unix socket, against a bare Unix-socket echo round trip of
// a frame of the same size measured in the same process. And the cost of
// durability (H5): alloc+free pairs of a daemon recording them in its
// metadata pool (on /dev/shm, and on a plain file of the disk) against one
// without metadata, in alternating rounds of the same run. And the cost of
// metrics (O4): the same pairs and translates against a daemon with its
// Prometheus endpoint on (counting every request, scraped once a second)
// and the durable one without, in alternating rounds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>

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
    // A page of its own (smaller ones share pages: bench/sub_page_bench.cpp).
    auto a = client.alloc(64 << 10, {.tier = Tier::dram});
    if (!a.ok() || !client.free(a->gva).ok()) {
      std::fprintf(stderr, "alloc/free failed\n");
      return 0;
    }
  }
  return n / (bench::now_seconds() - start);
}

// One GET /metrics on 127.0.0.1:`port`; the bytes of the answer.
size_t scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  size_t got = 0;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const char request[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    (void)::write(fd, request, sizeof request - 1);
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got += static_cast<size_t>(n);
  }
  ::close(fd);
  return got;
}

std::vector<double> translate_rtts(Client& client, Gva target, int n) {
  std::vector<double> rtt;
  for (int i = 0; i < n; ++i) {
    const double t0 = bench::now_seconds();
    auto t = client.translate(target.plus(static_cast<uint64_t>(i) % (1 << 20)));
    rtt.push_back(bench::now_seconds() - t0);
    if (!t.ok()) return {};
  }
  return rtt;
}

}  // namespace

int main() {
  // Metrics off but where they are measured, so that they cost the other
  // figures nothing.
  const test::DaemonOptions base{
      .dram = "256MiB", .pmem = "8MiB", .page_size = "64KiB", .extra_toml = "[metrics]\nenabled = false\n"};
  test::TestDaemon daemon(base);
  test::DaemonOptions volatile_options = base, disk_options = base;
  volatile_options.extra_toml += "[metadata]\nenabled = false\n";
  const std::string disk_dir = test::make_temp_dir_in("/var/tmp", "tiermem-bench-meta");
  disk_options.extra_toml += "[metadata]\npath = \"" + disk_dir + "/metadata.pool\"\n";
  test::DaemonOptions metrics_options = base;
  metrics_options.extra_toml.clear();
  metrics_options.metrics = true;
  test::TestDaemon volatile_daemon(volatile_options), disk_daemon(disk_options), metrics_daemon(metrics_options);
  for (test::TestDaemon* d : {&daemon, &volatile_daemon, &disk_daemon, &metrics_daemon}) {
    if (!d->ready()) {
      std::fprintf(stderr, "tiermemd did not start:\n%s\n", d->log().c_str());
      return 1;
    }
  }
  auto client = daemon.connect("control_plane_bench");
  auto volatile_client = volatile_daemon.connect("control_plane_bench");
  auto disk_client = disk_daemon.connect("control_plane_bench");
  auto metrics_client = metrics_daemon.connect("control_plane_bench");
  constexpr int k_pairs = 1000, k_rounds = 5;
  constexpr int k_translates = 20000;

  for (Client* c : {client.get(), volatile_client.get(), disk_client.get(), metrics_client.get()}) {
    (void)pairs_rate(*c, 200);  // warm up
  }
  // A scraper as Prometheus would be, once a second (its default is 15 s).
  std::atomic<bool> scraping{true};
  std::atomic<uint64_t> scrapes{0}, scraped_bytes{0};
  std::thread scraper([&] {
    while (scraping) {
      scraped_bytes += scrape(metrics_daemon.metrics_port());
      ++scrapes;
      for (int i = 0; i < 10 && scraping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<double> durable, forgetful, on_disk, metered;
  for (int r = 0; r < k_rounds; ++r) {
    durable.push_back(pairs_rate(*client, k_pairs));
    metered.push_back(pairs_rate(*metrics_client, k_pairs));
    forgetful.push_back(pairs_rate(*volatile_client, k_pairs));
    on_disk.push_back(pairs_rate(*disk_client, k_pairs / 10));
  }
  for (const auto* v : {&durable, &forgetful, &on_disk, &metered}) {
    if (std::find(v->begin(), v->end(), 0.0) != v->end()) return 1;
  }
  const double pairs_per_s = bench::percentile(durable, 0.5);
  const double volatile_per_s = bench::percentile(forgetful, 0.5);
  const double disk_per_s = bench::percentile(on_disk, 0.5);
  const double metered_per_s = bench::percentile(metered, 0.5);
  std::filesystem::remove_all(disk_dir);

  auto target = client->alloc(1 << 20);
  auto metered_target = metrics_client->alloc(1 << 20);
  if (!target.ok() || !metered_target.ok()) return 1;
  std::vector<double> rtt, metered_rtt;
  for (int r = 0; r < k_rounds; ++r) {  // alternating, as the pairs
    auto a = translate_rtts(*client, target->gva, k_translates / k_rounds);
    auto b = translate_rtts(*metrics_client, metered_target->gva, k_translates / k_rounds);
    if (a.empty() || b.empty()) return 1;
    rtt.insert(rtt.end(), a.begin(), a.end());
    metered_rtt.insert(metered_rtt.end(), b.begin(), b.end());
  }
  scraping = false;
  scraper.join();
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
  bench::note("metrics on: every request counted, " + std::to_string(scrapes.load()) + " scrapes of " +
              std::to_string(scrapes.load() == 0 ? 0 : scraped_bytes.load() / scrapes.load()) +
              " bytes during the rounds; baseline: the same daemon with metrics off");
  bench::figure("alloc_free_pairs_rate_metrics_on", metered_per_s, "pairs/s");
  bench::figure("translate_rtt_p50_metrics_on", bench::percentile(metered_rtt, 0.5) * 1e6, "us");
  bench::ratio("alloc_free_metrics_on_vs_off", metered_per_s / pairs_per_s);
  bench::ratio("translate_rate_metrics_on_vs_off", bench::percentile(rtt, 0.5) / bench::percentile(metered_rtt, 0.5));
  return 0;
}
