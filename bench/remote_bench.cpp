// Remote access through the data plane: libtiermem reading and writing memory
// homed on another daemon at 4 KiB .. 16 MiB, one call at a time; 8-byte read
// latency; fetch-add rates. Also the bare transport (no page versions) to the
// same memory, to show what the seqlock protocol costs on top of it.
//
// Against the physical anchor measured in the same run (bench/
// loopback_anchor.hpp): a TCP loopback request/reply of the same size, a
// thread of this process answering. Puts are set against "size out, 8 back",
// gets against "8 out, size back", an 8-byte read's latency and a fetch-add's
// rate against the 8-byte exchange.
//
// Usage: remote_bench [tls] [--busy N] [--fabric libfabric --provider P]
//   tls: tcp, sm, rc, ... (UCX_TLS; starts its own two daemons)
//   --fabric libfabric --provider P: the daemons' data plane over libfabric
//   ([transport] fabric and provider; P: shm, "tcp;ofi_rxm", ...) instead of UCX
//   --busy N: N processes spin beside the measurement (a trainer computing on
//   every core; -1: one per core); every figure is then named busy_<name>.
// bench/remote.sh runs it several times, idle and busy, and prints medians,
// spreads and the goals.
#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <tiermem/batch.h>
#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "bench/bench_util.hpp"
#include "bench/busy_load.hpp"
#include "bench/loopback_anchor.hpp"
#include "convert.hpp"
#include "rpc_connection.hpp"
#include "tests/support/test_daemon.hpp"
#include "access/remote_memory.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20};

int iterations(size_t size) { return static_cast<int>(std::max<size_t>(16, std::min<size_t>(2000, (512u << 20) / size))); }

// Seconds per call of `fn`, over `n` calls or about a second and a half,
// whichever ends first (at least 16: under load a call may take long).
double seconds_per_call(int n, const std::function<void()>& fn) {
  const double start = bench::now_seconds();
  int done = 0;
  while (done < n && (done < 16 || bench::now_seconds() - start < 1.5)) {
    fn();
    ++done;
  }
  return (bench::now_seconds() - start) / done;
}

// CPU seconds a process has used (all its threads), and its context
// switches (wake-ups), from /proc.
struct ProcessTimes {
  double cpu = 0;
  uint64_t switches = 0;
};
ProcessTimes process_times(pid_t pid) {
  ProcessTimes t;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return t;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (FILE* f = std::fopen((dir + "/" + e->d_name + "/stat").c_str(), "r")) {
      char line[1024] = {};
      const size_t n = std::fread(line, 1, sizeof line - 1, f);
      std::fclose(f);
      const char* rest = std::strrchr(line, ')');  // fields after the command name
      unsigned long utime = 0, stime = 0;
      if (n > 0 && rest != nullptr &&
          std::sscanf(rest + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) == 2) {
        t.cpu += static_cast<double>(utime + stime) / tick;
      }
    }
    if (FILE* f = std::fopen((dir + "/" + e->d_name + "/status").c_str(), "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f) != nullptr) {
        unsigned long long v = 0;
        if (std::sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1 ||
            std::sscanf(line, "nonvoluntary_ctxt_switches: %llu", &v) == 1) {
          t.switches += v;
        }
      }
      std::fclose(f);
    }
  }
  ::closedir(d);
  return t;
}

std::string size_name(size_t size) { return size < 1024 ? std::to_string(size) + "B" : std::to_string(size >> 10) + "KiB"; }

// The bare transport to node 2's DRAM region, from the region keys node 1
// hands out.
Result<std::unique_ptr<RemoteFrameData>> bare_transport(const std::string& socket, Transport& transport,
                                                        std::shared_ptr<RemoteNode>* keep) {
  TIERMEM_ASSIGN_OR_RETURN(auto conn, RpcConnection::connect_unix(socket));
  proto::Request hello;
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  if (auto r = conn->call(hello); !r.ok()) return r.status();
  proto::Request nodes;
  nodes.mutable_nodes();
  TIERMEM_ASSIGN_OR_RETURN(auto r, conn->call(nodes));
  for (const auto& n : r.nodes().nodes()) {
    if (n.node_id() != 2) continue;
    TIERMEM_ASSIGN_OR_RETURN(auto node, connect_remote_node(transport, wire::advert_of(n)));
    *keep = node;
    return std::make_unique<RemoteFrameData>(transport, node, Tier::dram, std::chrono::seconds(30), nullptr);
  }
  return Status(ErrorCode::not_found, "node 2 is not connected");
}

}  // namespace

int main(int argc, char** argv) {
  std::string tls;
  int busy = 0;
  FabricChoice fabric;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--busy" && i + 1 < argc) {
      busy = std::atoi(argv[++i]);
    } else if (a == "--fabric" && i + 1 < argc) {
      fabric.fabric = argv[++i];
    } else if (a == "--provider" && i + 1 < argc) {
      fabric.provider = argv[++i];
    } else {
      tls = a;
    }
  }
  if (busy < 0) busy = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const std::string p = busy > 0 ? "busy_" : "";
  if (!tls.empty()) ::setenv("UCX_TLS", tls.c_str(), 1);
  // The data plane, as between hosts: memory of another daemon of this host
  // is not mapped here (bench/same_host_bench measures that).
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  test::DaemonOptions o;
  o.tls = tls;
  o.dram = "512MiB";
  o.pmem = "8MiB";
  o.max_frame = "64MiB";
  o.max_inline = "32MiB";
  if (fabric.fabric != "ucx") {
    o.extra_toml = "[transport]\nfabric = \"" + fabric.fabric + "\"\nprovider = \"" + fabric.provider + "\"\n";
  }
  test::TestCluster cluster(2, o);
  if (!cluster.ready() || !cluster.wait_connected()) {
    std::fprintf(stderr, "cluster did not start:\n%s\n", cluster.logs().c_str());
    return 1;
  }
  auto client = cluster.node(1).connect("remote_bench");
  auto region = client->alloc(16 << 20, {.tier = Tier::dram, .node = 2});
  auto counter = client->alloc(4096, {.tier = Tier::dram, .node = 2, .coherent = true});
  auto locked = client->alloc(4096, {.tier = Tier::dram, .node = 2});
  if (!region.ok() || !counter.ok() || !locked.ok()) {
    std::fprintf(stderr, "alloc failed\n");
    return 1;
  }
  bench::LoopbackAnchor anchor;
  if (!anchor.ok()) {
    std::fprintf(stderr, "the TCP loopback anchor could not connect\n");
    return 1;
  }
  std::vector<char> buf(16 << 20, 'x');
  std::vector<char> wire(16 << 20, 'y');
  (void)client->write(region->gva, buf.data(), 4096);  // warm up: connect, translate
  const std::string t = fabric.fabric != "ucx" ? fabric.name() : "UCX_TLS=" + (tls.empty() ? "default" : tls);
  bench::BusyLoad load(busy);
  bench::note("client on node 1, memory on node 2, " + t + "; one call at a time; " +
              (busy > 0 ? std::to_string(busy) + " busy loop(s) beside" : std::string("nothing beside")) +
              "; anchor: TCP loopback request/reply in this process");
  for (size_t size : k_sizes) {
    const int n = iterations(size);
    const std::string s = size_name(size);
    (void)client->write(region->gva, buf.data(), size);
    for (int i = 0; i < 8; ++i) (void)anchor.exchange(wire, size, size);  // warm up: TCP's windows
    const double a_put = seconds_per_call(n, [&] { (void)anchor.exchange(wire, size, 8); });
    const double a_get = seconds_per_call(n, [&] { (void)anchor.exchange(wire, 8, size); });
    const double put = seconds_per_call(n, [&] { (void)client->write(region->gva, buf.data(), size); });
    const double get = seconds_per_call(n, [&] { (void)client->read(region->gva, buf.data(), size); });
    bench::figure(p + "loopback_put_bw_" + s, static_cast<double>(size) / a_put / 1e6, "MB/s");
    bench::figure(p + "loopback_get_bw_" + s, static_cast<double>(size) / a_get / 1e6, "MB/s");
    bench::figure(p + "client_put_bw_" + s, static_cast<double>(size) / put / 1e6, "MB/s");
    bench::figure(p + "client_get_bw_" + s, static_cast<double>(size) / get / 1e6, "MB/s");
    bench::ratio(p + "client_put_bw_" + s + "_vs_loopback", a_put / put);
    bench::ratio(p + "client_get_bw_" + s + "_vs_loopback", a_get / get);
  }
  std::vector<double> lat, anchor_lat;
  uint64_t word = 0;
  const double lat_start = bench::now_seconds();
  for (int i = 0; i < 2000 && (i < 100 || bench::now_seconds() - lat_start < 3); ++i) {
    anchor_lat.push_back(anchor.exchange(wire, 8, 8));
    const double t0 = bench::now_seconds();
    (void)client->read(region->gva, &word, 8);
    lat.push_back(bench::now_seconds() - t0);
  }
  const double anchor_p50 = bench::percentile(anchor_lat, 0.5);
  bench::figure(p + "loopback_rr_8B_latency_p50", anchor_p50 * 1e6, "us");
  bench::figure(p + "client_get_8B_latency_p50", bench::percentile(lat, 0.5) * 1e6, "us");
  bench::figure(p + "client_get_8B_latency_p90", bench::percentile(lat, 0.9) * 1e6, "us");
  bench::ratio(p + "client_get_8B_latency_vs_loopback", bench::percentile(lat, 0.5) / anchor_p50);
  const double rr_rate = 1 / seconds_per_call(4000, [&] { (void)anchor.exchange(wire, 8, 8); });
  bench::figure(p + "loopback_rr_rate", rr_rate, "ops/s");
  for (bool coherent : {true, false}) {
    const Gva g = coherent ? counter->gva : locked->gva;
    (void)client->fetch_add(g, 1);
    const double rate = 1 / seconds_per_call(4000, [&] { (void)client->fetch_add(g, 1); });
    const std::string name = std::string("client_fadd_rate_") + (coherent ? "coherent" : "locked");
    bench::figure(p + name, rate, "ops/s");
    bench::ratio(p + name + "_vs_loopback", rate / rr_rate);
  }

  // The bare transport: the same memory without the page-version protocol.
  UcxOptions common;
  // tcp;ofi_rxm picks its interface by source address: lo, where the daemons are.
  if (fabric.fabric != "ucx" && fabric.provider.starts_with("tcp")) common.listen_ip = "127.0.0.1";
  auto transport = make_transport(fabric, common);
  std::shared_ptr<RemoteNode> node;
  auto frames = transport.ok() ? bare_transport(cluster.node(1).socket(), **transport, &node)
                               : Result<std::unique_ptr<RemoteFrameData>>(transport.status());
  if (!frames.ok()) {
    std::fprintf(stderr, "bare transport: %s\n", frames.status().to_string().c_str());
    return 1;
  }
  auto t2 = client->translate(region->gva);
  const uint64_t frame = t2->extents.front().frame_offset;
  for (size_t size : k_sizes) {
    const int n = iterations(size);
    const double put = seconds_per_call(n, [&] { (void)(*frames)->write(frame, buf.data(), size); });
    const double get = seconds_per_call(n, [&] { (void)(*frames)->read(frame, buf.data(), size); });
    const std::string s = size_name(size);
    bench::figure(p + "transport_put_bw_" + s, static_cast<double>(size) / put / 1e6, "MB/s");
    bench::figure(p + "transport_get_bw_" + s, static_cast<double>(size) / get / 1e6, "MB/s");
  }
  lat.clear();
  for (int i = 0; i < 2000 && (i < 100 || bench::now_seconds() - lat_start < 30); ++i) {
    const double t0 = bench::now_seconds();
    (void)(*frames)->read(frame, &word, 8);
    lat.push_back(bench::now_seconds() - t0);
  }
  bench::figure(p + "transport_get_8B_latency_p50", bench::percentile(lat, 0.5) * 1e6, "us");

  // A boundary message as tiermem-exec sends one (Mailboxes::send): a
  // 128-byte header and the payload, a fence, the receiver's sequence word
  // from n to n + 1, as one Batch; against a bare put of the same bytes and
  // a fetch-add in one transport batch (no page protocol). The receiver
  // sees the word in its own memory (a load), not counted.
  auto word_translation = client->translate(counter->gva);
  const uint64_t word_frame = word_translation->extents.front().frame_offset;
  // Alternating rounds, medians: the two share the machine's noise.
  for (size_t size : {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20}) {
    const int n = std::max(8, iterations(size) / 4);
    std::vector<double> bare_rounds, our_rounds;
    for (int round = 0; round < 7; ++round) {
      bare_rounds.push_back(seconds_per_call(n, [&] {
        auto b = (*transport)->batch();
        uint64_t old = 0;
        (void)(*frames)->issue_write(*b, frame, buf.data(), 128 + size);
        (void)(*frames)->issue_atomic(*b, word_frame, WordOp::fetch_add, 1, 0, &old);
        (void)(*transport)->wait(*b, std::chrono::seconds(30));
      }));
      uint64_t sequence = 0;
      (void)client->read(counter->gva, &sequence, 8);
      our_rounds.push_back(seconds_per_call(n, [&] {
        Batch b(*client);
        b.write(region->gva, buf.data(), 128);
        b.write(region->gva.plus(128), buf.data() + 128, size);
        b.fence();
        b.compare_swap(counter->gva, sequence, sequence + 1);
        ++sequence;
        (void)b.wait();
      }));
    }
    const double bare = bench::median(bare_rounds), ours = bench::median(our_rounds);
    const std::string s = size_name(size);
    bench::figure(p + "boundary_send_" + s, ours * 1e6, "us");
    bench::figure(p + "bare_put_fadd_" + s, bare * 1e6, "us");
    bench::ratio(p + "boundary_send_" + s + "_vs_bare_put_fadd", ours / bare);
  }
  if (busy == 0) {
    // What the home daemon costs while its remote clients are connected and
    // quiet (heartbeats to its peer go on: 300 ms here).
    const pid_t home = cluster.node(2).pid();
    const ProcessTimes before = process_times(home);
    const double start = bench::now_seconds();
    ::sleep(5);
    const ProcessTimes after = process_times(home);
    const double s = bench::now_seconds() - start;
    bench::figure("daemon_idle_cpu", (after.cpu - before.cpu) / s * 1e3, "ms/s");
    bench::figure("daemon_idle_wakeups", static_cast<double>(after.switches - before.switches) / s, "/s");
  }
  return 0;
}
