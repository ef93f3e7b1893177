// Batches (issue 31): streamed 4 KiB reads and writes, 64 to a batch, against
// the same calls one at a time, to memory on another node over TCP (nodes as
// hosts) and on another daemon of this host (mapped); fetch-adds with 32
// outstanding against one; and a TCP stream of 4 KiB messages over loopback
// in the same process as the fabric's streamed baseline. Medians of 5
// rounds. Daemons of one host are reached mapped (a call is a memcpy; with
// mapping off, UCX 1.13 reaches them through their listener, over TCP: the
// tcp figures), so the stream is the baseline there too. Goals: batched >= 5x one at a time and >= 0.8 of the stream;
// fetch-add 32 outstanding >= 4x one (TCP).
// Usage: batch_bench   (starts its own two daemons per mode; TIERMEMD names the binary)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/batch.h>
#include <tiermem/client.h>

#include "bench/bench_util.hpp"
#include "tests/support/test_daemon.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_size = 4 << 10;
constexpr int k_ops = 2048;
constexpr int k_batch = 64;
constexpr int k_rounds = 5;

// Bytes per second of a one-way stream of 4 KiB messages over TCP loopback.
double loopback_stream() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::listen(listener, 1);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const size_t total = size_t{k_ops} * k_size * 4;
  std::thread reader([&] {
    const int s = ::accept(listener, nullptr, nullptr);
    std::vector<char> buf(k_size);
    size_t got = 0;
    while (got < total) {
      const ssize_t n = ::read(s, buf.data(), buf.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    (void)!::write(s, "k", 1);
    ::close(s);
  });
  const int c = ::socket(AF_INET, SOCK_STREAM, 0);
  ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
  std::vector<char> buf(k_size, 'x');
  const double t0 = bench::now_seconds();
  for (size_t sent = 0; sent < total; sent += k_size) (void)!::write(c, buf.data(), k_size);
  char k;
  (void)!::read(c, &k, 1);
  const double seconds = bench::now_seconds() - t0;
  reader.join();
  ::close(c);
  ::close(listener);
  return static_cast<double>(total) / seconds;
}

struct Figures {
  std::vector<double> one_read, one_write, batch_read, batch_write, fadd_one, fadd_32;
};

void measure(Client& c, Gva region, Gva counter, std::vector<char>& buf, Figures* f) {
  const size_t span = size_t{k_batch} * k_size;
  for (bool write : {true, false}) {
    double t0 = bench::now_seconds();
    for (int i = 0; i < k_ops; ++i) {
      const Gva g = region.plus((i % k_batch) * k_size);
      char* p = buf.data() + (i % k_batch) * k_size;
      (void)(write ? c.write(g, p, k_size) : c.read(g, p, k_size));
    }
    (write ? f->one_write : f->one_read).push_back(double(k_ops) * k_size / (bench::now_seconds() - t0));
    t0 = bench::now_seconds();
    for (int i = 0; i < k_ops; i += k_batch) {
      Batch b(c);
      for (int j = 0; j < k_batch; ++j) {
        write ? b.write(region.plus(j * k_size), buf.data() + j * k_size, k_size)
              : b.read(region.plus(j * k_size), buf.data() + j * k_size, k_size);
      }
      (void)b.wait();
    }
    (write ? f->batch_write : f->batch_read).push_back(double(k_ops) * k_size / (bench::now_seconds() - t0));
    (void)span;
  }
  constexpr int k_adds = 1024;
  double t0 = bench::now_seconds();
  for (int i = 0; i < k_adds; ++i) (void)c.fetch_add(counter, 1);
  f->fadd_one.push_back(k_adds / (bench::now_seconds() - t0));
  t0 = bench::now_seconds();
  for (int i = 0; i < k_adds; i += 32) {
    Batch b(c);
    for (int j = 0; j < 32; ++j) b.fetch_add(counter, 1);
    (void)b.wait();
  }
  f->fadd_32.push_back(k_adds / (bench::now_seconds() - t0));
}

int run(const std::string& mode) {
  if (mode == "tcp") {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  } else {
    ::unsetenv("UCX_TLS");
    ::unsetenv("TIERMEM_MAP_SAME_HOST");
  }
  test::DaemonOptions o;
  o.dram = "64MiB";
  o.pmem = "8MiB";
  if (mode == "tcp") o.tls = "tcp";
  test::TestCluster cluster(2, o);
  if (!cluster.ready() || !cluster.wait_connected()) {
    std::fprintf(stderr, "cluster did not start:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto client = cluster.node(1).connect("batch_bench");
  auto region = client->alloc(size_t{k_batch} * k_size, {.tier = Tier::dram, .node = 2});
  auto counter = client->alloc(64, {.tier = Tier::dram, .node = 2, .coherent = true});
  if (!region.ok() || !counter.ok()) {
    std::fprintf(stderr, "alloc on node 2 failed\n");
    return 1;
  }
  std::vector<char> buf(size_t{k_batch} * k_size, 'x');
  (void)client->write(region->gva, buf.data(), buf.size());
  Figures f;
  std::vector<double> stream;
  for (int r = 0; r < k_rounds; ++r) {
    measure(*client, region->gva, counter->gva, buf, &f);
    stream.push_back(loopback_stream());
  }
  const std::string m = mode + "_";
  const double s = bench::median(stream);
  bench::figure(m + "loopback_stream_4KiB", s / 1e6, "MB/s");
  for (bool write : {true, false}) {
    const std::string w = write ? "write" : "read";
    const double one = bench::median(write ? f.one_write : f.one_read);
    const double batched = bench::median(write ? f.batch_write : f.batch_read);
    bench::figure(m + w + "_4KiB_one_at_a_time", one / 1e6, "MB/s");
    bench::figure(m + w + "_4KiB_batches_of_64", batched / 1e6, "MB/s");
    bench::ratio(m + w + "_4KiB_batched_vs_one_at_a_time", batched / one);
    bench::ratio(m + w + "_4KiB_batched_vs_loopback_stream", batched / s);
  }
  bench::figure(m + "fadd_one_outstanding", bench::median(f.fadd_one), "ops/s");
  bench::figure(m + "fadd_32_outstanding", bench::median(f.fadd_32), "ops/s");
  bench::ratio(m + "fadd_32_vs_one_outstanding", bench::median(f.fadd_32) / bench::median(f.fadd_one));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bench::note("batches of 64 4 KiB operations (and 32 fetch-adds) against one at a time, memory on node 2, client "
              "on node 1; threads: " + std::string(std::getenv("TIERMEM_BATCH_THREADS") ? std::getenv("TIERMEM_BATCH_THREADS") : "1 (default)"));
  int rc = 0;
  for (const std::string mode : {"tcp", "same_host"}) {
    if (argc > 1 && mode != argv[1]) continue;
    rc |= run(mode);
  }
  return rc;
}
