// Remote access through the data plane: libtiermem reading and writing memory
// homed on another daemon, one-sided, at 4 KiB .. 16 MiB; 8-byte read latency;
// fetch-add rate. Also the bare transport (no page versions) to the same
// memory, to show what the seqlock protocol costs on top of UCX.
// Usage: remote_bench [tls]   (tcp, sm, ...; starts its own two daemons)
// bench/remote.sh runs it beside ucx_perftest and prints the ratios.
#include <cstring>
#include <string>
#include <vector>

#include <tiermem/client.h>
#include <tiermem/status_macros.h>

#include "bench/bench_util.hpp"
#include "convert.hpp"
#include "rpc_connection.hpp"
#include "tests/support/test_daemon.hpp"
#include "access/node_advert.hpp"
#include "access/remote_memory.hpp"

using namespace tiermem;

namespace {

constexpr size_t k_sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20};

int iterations(size_t size) { return static_cast<int>(std::max<size_t>(16, std::min<size_t>(2000, (512u << 20) / size))); }

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
    TIERMEM_ASSIGN_OR_RETURN(auto node, connect_remote_node(transport, advert_of(n)));
    *keep = node;
    return std::make_unique<RemoteFrameData>(transport, node, Tier::dram, std::chrono::seconds(30), nullptr);
  }
  return Status(ErrorCode::not_found, "node 2 is not connected");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tls = argc > 1 ? argv[1] : "";
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
  std::vector<char> buf(16 << 20, 'x');
  const std::string t = tls.empty() ? "default" : tls;
  bench::note("client on node 1, memory on node 2, UCX_TLS=" + t + "; one call at a time");
  for (size_t size : k_sizes) {
    const int n = iterations(size);
    (void)client->write(region->gva, buf.data(), size);  // warm up: connect, translate
    double start = bench::now_seconds();
    for (int i = 0; i < n; ++i) (void)client->write(region->gva, buf.data(), size);
    const double put_s = bench::now_seconds() - start;
    start = bench::now_seconds();
    for (int i = 0; i < n; ++i) (void)client->read(region->gva, buf.data(), size);
    const double get_s = bench::now_seconds() - start;
    const std::string s = std::to_string(size >> 10) + "KiB";
    bench::figure("client_put_bw_" + s, static_cast<double>(size) * n / put_s / 1e6, "MB/s");
    bench::figure("client_get_bw_" + s, static_cast<double>(size) * n / get_s / 1e6, "MB/s");
  }
  std::vector<double> lat;
  uint64_t word = 0;
  for (int i = 0; i < 2000; ++i) {
    const double t0 = bench::now_seconds();
    (void)client->read(region->gva, &word, 8);
    lat.push_back(bench::now_seconds() - t0);
  }
  bench::figure("client_get_8B_latency_p50", bench::percentile(lat, 0.5) * 1e6, "us");
  for (bool coherent : {true, false}) {
    const Gva g = coherent ? counter->gva : locked->gva;
    const int n = 4000;
    (void)client->fetch_add(g, 1);
    const double start = bench::now_seconds();
    for (int i = 0; i < n; ++i) (void)client->fetch_add(g, 1);
    const double rate = n / (bench::now_seconds() - start);
    bench::figure(std::string("client_fadd_rate_") + (coherent ? "coherent" : "locked"), rate, "ops/s");
  }

  // The bare transport: the same memory without the page-version protocol.
  auto transport = make_ucx_transport({});
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
    double start = bench::now_seconds();
    for (int i = 0; i < n; ++i) (void)(*frames)->write(frame, buf.data(), size);
    const double put_s = bench::now_seconds() - start;
    start = bench::now_seconds();
    for (int i = 0; i < n; ++i) (void)(*frames)->read(frame, buf.data(), size);
    const double get_s = bench::now_seconds() - start;
    const std::string s = std::to_string(size >> 10) + "KiB";
    bench::figure("transport_put_bw_" + s, static_cast<double>(size) * n / put_s / 1e6, "MB/s");
    bench::figure("transport_get_bw_" + s, static_cast<double>(size) * n / get_s / 1e6, "MB/s");
  }
  lat.clear();
  for (int i = 0; i < 2000; ++i) {
    const double t0 = bench::now_seconds();
    (void)(*frames)->read(frame, &word, 8);
    lat.push_back(bench::now_seconds() - t0);
  }
  bench::figure("transport_get_8B_latency_p50", bench::percentile(lat, 0.5) * 1e6, "us");
  return 0;
}
