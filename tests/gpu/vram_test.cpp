// The VRAM tier on a real GPU (suite `gpu`; run on the device machine). Exits
// 77 (skipped) where no CUDA device is present.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <tiermem/client.h>

#include "mapping/address_space.hpp"
#include "tiers/tier_backend.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

TEST(VramTierTest, WriteReadDiscardAndCopyFromDram) {
  auto vram = make_vram_tier(0, 64 << 20);
  ASSERT_TRUE(vram.ok()) << vram.status().to_string();
  EXPECT_EQ((*vram)->tier(), Tier::vram);
  EXPECT_EQ((*vram)->host_base(), nullptr);
  EXPECT_NE((*vram)->region_base(), nullptr);
  EXPECT_EQ((*vram)->device_uuid().size(), 16u);
  ASSERT_GT((*vram)->chunk_bytes(), 0u);
  ASSERT_TRUE((*vram)->open_domain(0, 64 << 20).ok());
  EXPECT_TRUE((*vram)->device_chunks(0, 64 << 20, 64).empty()) << "no memory before frames are committed";
  ASSERT_TRUE((*vram)->commit(0, 24 << 20).ok());
  EXPECT_EQ((*vram)->device_chunks(0, 64 << 20, 64).size(), (24u << 20) / (*vram)->chunk_bytes() + 1);
  std::vector<unsigned char> out(8 << 20), in(8 << 20);
  std::iota(out.begin(), out.end(), 3);
  ASSERT_TRUE((*vram)->write(16 << 20, out.data(), out.size()).ok());
  ASSERT_TRUE((*vram)->read(16 << 20, in.data(), in.size()).ok());
  EXPECT_EQ(in, out);
  ASSERT_TRUE((*vram)->discard(16 << 20, 8 << 20).ok());
  ASSERT_TRUE((*vram)->read(16 << 20, in.data(), in.size()).ok());
  EXPECT_EQ(in, std::vector<unsigned char>(in.size(), 0));
  const std::string dir = test::make_temp_dir("tiermem-gpu");
  auto dram = make_dram_tier({dir, 8 << 20, 1});
  ASSERT_TRUE((*dram)->open_domain(0, 8 << 20).ok());
  ASSERT_TRUE((*dram)->write(0, out.data(), out.size()).ok());
  ASSERT_TRUE((*vram)->copy_from(**dram, 0, 0, out.size()).ok());
  ASSERT_TRUE((*vram)->read(0, in.data(), in.size()).ok());
  EXPECT_EQ(in, out);
}

// The daemon's defaults: half the free VRAM for each of 16 tenants' domains,
// as device addresses only; memory comes with frames, in any domain.
TEST(VramTierTest, AutoCapacityReservesAddressesForEveryDomain) {
  auto vram = make_vram_tier(0, 0, 16);
  ASSERT_TRUE(vram.ok()) << vram.status().to_string();
  EXPECT_GT((*vram)->capacity(), uint64_t{1} << 30);
  EXPECT_EQ((*vram)->domains(), 16u);
  const uint64_t last = 15 * (*vram)->domain_span();
  ASSERT_TRUE((*vram)->open_domain(15, 256 << 20).ok());
  ASSERT_TRUE((*vram)->commit(last + (128 << 20), 4096).ok());
  const char text[] = "the last domain";
  ASSERT_TRUE((*vram)->write(last + (128 << 20), text, sizeof text).ok());
  char back[sizeof text] = {};
  ASSERT_TRUE((*vram)->read(last + (128 << 20), back, sizeof back).ok());
  EXPECT_STREQ(back, text);
  EXPECT_EQ((*vram)->device_chunks(last, 256 << 20, 64).size(), 1u);
}

TEST(VramTierTest, AutoPlacementPrefersVramAndFallsBackToDram) {
  TierSet tiers;
  tiers[static_cast<size_t>(Tier::vram)] = std::move(make_vram_tier(0, 8 << 20)).value();
  const std::string dir = test::make_temp_dir("tiermem-gpu");
  tiers[static_cast<size_t>(Tier::dram)] = std::move(make_dram_tier({dir, 8 << 20, 1})).value();
  auto space =
      std::move(AddressSpace::create({.node = 1, .page_size = 2 << 20, .versions_dir = dir}, std::move(tiers))).value();
  auto first = space->allocate({.size = 6 << 20});
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->tier, Tier::vram);
  auto second = space->allocate({.size = 4 << 20});
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(second->tier, Tier::dram) << "VRAM has one page left";
  std::vector<char> data(6 << 20, 'v'), back(6 << 20);
  ASSERT_TRUE(space->write(first->gva, data.data(), data.size()).ok());
  ASSERT_TRUE(space->read(first->gva, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
}

TEST(VramDaemonTest, ClientAllocWriteReadOnVram) {
  test::TestDaemon daemon({.vram = true, .vram_capacity = "256MiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  auto stat = client->stat();
  ASSERT_TRUE(stat.ok());
  ASSERT_EQ(stat->tiers.front().tier, Tier::vram);
  EXPECT_EQ(stat->tiers.front().capacity_bytes, 256u << 20);
  EXPECT_TRUE(stat->tiers.front().shareable);
  auto a = client->alloc(10 << 20, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<unsigned char> out(10 << 20), in(10 << 20);
  std::iota(out.begin(), out.end(), 11);
  const AccessCounters before = client->access_counters();
  ASSERT_TRUE(client->write(a->gva, out.data(), out.size()).ok());
  ASSERT_TRUE(client->read(a->gva, in.data(), in.size()).ok());
  EXPECT_EQ(in, out);
  const AccessCounters after = client->access_counters();
  EXPECT_EQ(after.through_daemon, before.through_daemon) << "co-located VRAM is copied by the client itself";
  EXPECT_EQ(after.direct_local, before.direct_local + 2);
  auto t = client->translate(a->gva);
  EXPECT_EQ(t->page.tier, Tier::vram);
  const auto r = test::run_ctl(daemon.socket(), {"alloc", "4MiB", "--tier", "vram", "--strict"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(client->free(a->gva).ok());
}

// map() of VRAM is a device pointer of this process: kernels write through
// it (cudaMemset's), cudaMemcpy reads it, the page protocol's readers see it,
// and so does another process (which imports the chunks itself). Mapped, the
// allocation is pinned against migration.
TEST(VramDaemonTest, MapGivesADevicePointerOthersSee) {
  test::TestDaemon daemon({.vram = true, .vram_capacity = "256MiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  auto a = client->alloc(6 << 20, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<unsigned char> out(6 << 20);
  std::iota(out.begin(), out.end(), 5);
  ASSERT_TRUE(client->write(a->gva, out.data(), out.size()).ok());
  auto m = client->map(a->gva);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(m->device(), device);
  EXPECT_EQ(m->size(), out.size());
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, m->data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
  std::vector<unsigned char> back(out.size());
  ASSERT_EQ(cudaMemcpy(back.data(), m->data(), back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, out) << "the mapping shows what write() wrote";
  ASSERT_EQ(cudaMemset(m->data() + 4096, 'k', 16), cudaSuccess);
  ASSERT_EQ(cudaMemset(m->data() + 4096 + 16, 0, 1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> word(17);
  ASSERT_TRUE(client->read(a->gva.plus(4096), word.data(), word.size()).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(word.data())), std::string(16, 'k'));
  const char* probe = std::getenv("TIERMEM_PROBE");
  if (probe != nullptr) {
    auto other = test::run_command({probe, daemon.socket(), "--direct", "read", a->gva.plus(4096).to_string(), "16"});
    EXPECT_EQ(other.out, "ok " + std::string(16, 'k') + "\n") << other.err;
    auto mapped = test::run_command({probe, daemon.socket(), "map", a->gva.to_string()});
    EXPECT_EQ(mapped.out.rfind("ok " + std::to_string(6 << 20) + ":cuda:", 0), 0u) << mapped.out << mapped.err;
  } else {
    ADD_FAILURE() << "TIERMEM_PROBE is not set: another process was not tried";
  }
  EXPECT_EQ(client->migrate(a->gva, Tier::dram).status().code(), ErrorCode::failed_precondition) << "mapped: pinned";
  m = Mapping();  // unmaps
  auto moved = client->migrate(a->gva, Tier::dram);
  ASSERT_TRUE(moved.ok()) << moved.status().to_string();
  ASSERT_TRUE(client->read(a->gva.plus(4096), word.data(), 16).ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(word.data()), 16), std::string(16, 'k'));
}

// A tenant's client gets the chunks of its own domain's VRAM, never those of
// another tenant's (the daemon checks every request; the probe makes it raw).
TEST(VramDaemonTest, AnotherTenantGetsNoChunksOfMyVram) {
  if (::geteuid() != 0) GTEST_SKIP() << "running a probe as another user needs root";
  const char* probe = std::getenv("TIERMEM_PROBE");
  ASSERT_NE(probe, nullptr) << "TIERMEM_PROBE is not set";
  const std::string dir = test::make_temp_dir("tiermem-gpu-probe");
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  std::filesystem::copy_file(probe, dir + "/tenant_probe");
  std::filesystem::permissions(dir + "/tenant_probe", std::filesystem::perms(0755));
  test::TestDaemon daemon({.vram = true, .vram_capacity = "256MiB", .control_toml = "socket_mode = \"0666\"\n"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  std::filesystem::permissions(daemon.dir(), std::filesystem::perms(0755));
  auto as_nobody = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                     dir + "/tenant_probe", daemon.socket()};
    argv.insert(argv.end(), args.begin(), args.end());
    return test::run_command(argv);
  };
  auto client = daemon.connect();  // root: an operator, of tenant uid:0
  auto mine = client->alloc(4 << 20, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(mine.ok()) << mine.status().to_string();
  auto t = client->translate(mine->gva);
  ASSERT_TRUE(t.ok());
  const uint64_t frame = t->extents.front().frame_offset;
  auto theirs = as_nobody({"alloc", std::to_string(4 << 20), "vram"});
  if (theirs.exit_code != 0 || theirs.out.rfind("ok ", 0) != 0) GTEST_SKIP() << "setpriv: " << theirs.out << theirs.err;
  std::string their_gva = theirs.out.substr(3);
  while (!their_gva.empty() && std::isspace(static_cast<unsigned char>(their_gva.back()))) their_gva.pop_back();
  auto their_t = client->translate(Gva::parse(their_gva).value());
  ASSERT_TRUE(their_t.ok()) << their_t.status().to_string();
  const uint64_t their_frame = their_t->extents.front().frame_offset;
  EXPECT_NE(their_frame / (256u << 20), frame / (256u << 20)) << "two tenants, two domains";
  const auto denied = as_nobody({"device_chunks", std::to_string(frame), std::to_string(4 << 20)});
  EXPECT_EQ(denied.out.rfind("error " + std::to_string(static_cast<unsigned>(ErrorCode::permission_denied)), 0), 0u)
      << denied.out << denied.err;
  const auto own = as_nobody({"device_chunks", std::to_string(their_frame), std::to_string(4 << 20)});
  EXPECT_EQ(own.out, "ok 1\n") << own.err;
  const auto read = as_nobody({"--direct", "read", mine->gva.to_string(), "8"});
  EXPECT_EQ(read.out.rfind("error " + std::to_string(static_cast<unsigned>(ErrorCode::permission_denied)), 0), 0u)
      << read.out;
}

// Migration VRAM -> DRAM -> PMEM -> VRAM while readers go on: every read is
// the whole pattern, on whichever tier it is.
TEST(VramDaemonTest, MigrationThroughEveryTierUnderConcurrentReaders) {
  test::TestDaemon daemon({.dram = "256MiB", .pmem = "256MiB", .vram = true, .vram_capacity = "256MiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  auto a = client->alloc(16 << 20, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<unsigned char> pattern(16 << 20);
  std::iota(pattern.begin(), pattern.end(), 9);
  ASSERT_TRUE(client->write(a->gva, pattern.data(), pattern.size()).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i) {
    readers.emplace_back([&, i] {
      auto own = daemon.connect();
      std::vector<unsigned char> in(pattern.size());
      void* device = nullptr;
      if (i == 2 && cudaMalloc(&device, in.size()) != cudaSuccess) device = nullptr;
      while (!stop.load()) {
        Status s = own->read(a->gva, device != nullptr ? device : in.data(), in.size());
        if (s.ok() && device != nullptr) s = cudaMemcpy(in.data(), device, in.size(), cudaMemcpyDeviceToHost) == cudaSuccess
                                                 ? Status() : Status(ErrorCode::io_error, "cudaMemcpy");
        if (!s.ok() || in != pattern) bad.fetch_add(1);
        reads.fetch_add(1);
      }
      if (device != nullptr) cudaFree(device);
    });
  }
  for (Tier to : {Tier::dram, Tier::pmem, Tier::vram, Tier::dram, Tier::vram}) {
    const uint64_t seen = reads.load();
    while (reads.load() < seen + 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto moved = client->migrate(a->gva, to);
    ASSERT_TRUE(moved.ok()) << tier_name(to) << ": " << moved.status().to_string();
    EXPECT_EQ(client->translate(a->gva)->page.tier, to);
  }
  const uint64_t seen = reads.load();
  while (reads.load() < seen + 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(bad.load(), 0u) << "of " << reads.load() << " reads";
  std::vector<unsigned char> in(pattern.size());
  ASSERT_TRUE(client->read(a->gva, in.data(), in.size()).ok());
  EXPECT_EQ(in, pattern);
}

// 1 GiB through the copy engines from device, pinned and pageable buffers,
// and a device buffer into VRAM never goes through the daemon.
TEST(VramDaemonTest, OneGibibyteFromEveryKindOfBuffer) {
  test::TestDaemon daemon({.vram = true, .vram_capacity = "2GiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  constexpr size_t k_size = size_t{1} << 30;
  auto a = client->alloc(k_size + 5, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<unsigned char> pattern(k_size);
  for (size_t i = 0; i < k_size; i += 4096) pattern[i] = static_cast<unsigned char>(i / 4096 * 7 + 1);
  pattern[k_size - 1] = 0x5a;
  void* device = nullptr;
  void* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(&device, k_size), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, k_size), cudaSuccess);
  const Gva at = a->gva.plus(5);
  const AccessCounters before = client->access_counters();
  Status s = client->write(at, pattern.data(), k_size);
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = client->read(at, pinned, k_size);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(std::memcmp(pinned, pattern.data(), k_size), 0) << "pageable in, pinned out";
  s = client->read(at, device, k_size);
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = client->write(at, device, k_size);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<unsigned char> back(k_size);
  s = client->read(at, back.data(), k_size);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(back, pattern) << "device out and back in";
  EXPECT_EQ(client->access_counters().through_daemon, before.through_daemon);
  cudaFree(device);
  cudaFreeHost(pinned);
}

// Memory homed in another node's VRAM, from pageable and device buffers,
// both ways: Debian's UCX has no CUDA, so the home daemon stages it (two
// daemons on this GPU, a cluster over loopback TCP).
TEST(VramClusterTest, RemoteVramIsReadableAndWritableFromAnotherNode) {
  test::TestCluster cluster(2, {.vram = true, .vram_capacity = "256MiB"});
  ASSERT_TRUE(cluster.ready()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
  auto near = cluster.node(1).connect();
  auto far = cluster.node(2).connect();
  auto a = far->alloc(3 << 20, {.tier = Tier::vram, .strict = true, .node = 1});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_EQ(a->gva.node, 1u);
  const std::vector<unsigned char> pattern = test::pattern(3 << 20, 17);
  Status s = far->write(a->gva, pattern.data(), pattern.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<unsigned char> in(pattern.size());
  s = near->read(a->gva, in.data(), in.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(in, pattern) << "written from node 2, read on the home node";
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, pattern.size()), cudaSuccess);
  s = far->read(a->gva, device, pattern.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  ASSERT_EQ(cudaMemcpy(in.data(), device, in.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, pattern) << "read from node 2 into a device buffer";
  const std::vector<unsigned char> other = test::pattern(3 << 20, 18);
  ASSERT_EQ(cudaMemcpy(device, other.data(), other.size(), cudaMemcpyHostToDevice), cudaSuccess);
  s = far->write(a->gva.plus(1), device, other.size() - 1);
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = near->read(a->gva.plus(1), in.data(), other.size() - 1);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(std::equal(other.begin(), other.end() - 1, in.begin())) << "a device buffer written from node 2";
  cudaFree(device);
}

// Requests of `type` that `c`'s daemon (`node`) answered (tiermem_requests_total).
uint64_t requests(Client& c, NodeId node, const std::string& type) {
  auto text = c.metrics(node);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  if (!text.ok()) return 0;
  const std::regex sample("\ntiermem_requests_total\\{node=\"" + std::to_string(node) + "\",type=\"" + type +
                          "\",[^}]*\\} ([0-9]+)");
  uint64_t sum = 0;
  for (std::sregex_iterator it(text->begin(), text->end(), sample), end; it != end; ++it) {
    sum += std::stoull((*it)[1].str());
  }
  return sum;
}

// Another node's VRAM has no route but its daemon (over TCP, same-host
// mapping off; no client holds a VRAM key): decided once per translation,
// so calls go to the daemon at once, without asking node 1 about node 2 or
// translating again on each call (they used to reconnect to node 2 and drop
// its translations every time).
TEST(VramClusterTest, RemoteVramGoesThroughTheDaemonWithoutReconnectingPerCall) {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("TIERMEM_MAP_SAME_HOST", "0", 1);
  test::TestCluster cluster(2, {.vram = true, .vram_capacity = "256MiB", .tls = "tcp"});
  ASSERT_TRUE(cluster.ready()) << cluster.logs();
  ASSERT_TRUE(cluster.wait_connected()) << cluster.logs();
  auto client = cluster.node(1).connect("far");
  auto admin = cluster.node(1).connect("metrics");
  ASSERT_TRUE(client && admin);
  auto a = client->alloc(1 << 20, {.tier = Tier::vram, .strict = true, .node = 2});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const std::vector<unsigned char> data = test::pattern(1 << 20, 5);
  Status s = client->write(a->gva, data.data(), data.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  const uint64_t translates = requests(*admin, 1, "translate");
  const uint64_t nodes = requests(*admin, 1, "nodes");
  constexpr int k_calls = 20;
  std::vector<unsigned char> in(data.size());
  for (int i = 0; i < k_calls; ++i) {
    ASSERT_TRUE(client->write(a->gva, data.data(), data.size()).ok());
    ASSERT_TRUE(client->read(a->gva, in.data(), in.size()).ok());
  }
  EXPECT_EQ(in, data);
  const AccessCounters c = client->access_counters();
  EXPECT_EQ(c.through_daemon, 1u + 2 * k_calls);
  EXPECT_EQ(c.message + c.direct_remote, 0u);
  EXPECT_EQ(requests(*admin, 1, "translate"), translates) << "calls translated again";
  EXPECT_EQ(requests(*admin, 1, "nodes"), nodes) << "calls asked node 1 about node 2 again";
  ::unsetenv("UCX_TLS");
  ::unsetenv("TIERMEM_MAP_SAME_HOST");
}

// CUDA device buffers (and pinned and pageable host buffers) as the source
// of write() and the target of read(), into every tier, at odd sizes and
// offsets: the library stages device memory through the host and never
// dereferences it (it used to segfault in memcpy).
TEST(DeviceBufferTest, DevicePinnedAndPageableBuffersIntoEveryTier) {
  test::TestDaemon daemon({.dram = "256MiB", .pmem = "256MiB", .vram = true, .vram_capacity = "512MiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  ASSERT_NE(client, nullptr);
  for (size_t size : {size_t{1}, size_t{4099}, size_t{1} << 20, size_t{64} << 20}) {
    std::vector<unsigned char> pattern(size);
    std::iota(pattern.begin(), pattern.end(), static_cast<unsigned char>(size));
    void* device = nullptr;
    void* pinned = nullptr;
    ASSERT_EQ(cudaMalloc(&device, size), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&pinned, size), cudaSuccess);
    for (Tier tier : {Tier::vram, Tier::dram, Tier::pmem}) {
      auto a = client->alloc(size + 3, {.tier = tier, .strict = true});
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      const Gva at = a->gva.plus(3);  // an unaligned offset
      // device -> tier -> device
      ASSERT_EQ(cudaMemcpy(device, pattern.data(), size, cudaMemcpyHostToDevice), cudaSuccess);
      Status w = client->write(at, device, size);
      ASSERT_TRUE(w.ok()) << tier_name(tier) << " " << size << ": " << w.to_string();
      ASSERT_EQ(cudaMemset(device, 0, size), cudaSuccess);
      Status r = client->read(at, device, size);
      ASSERT_TRUE(r.ok()) << tier_name(tier) << " " << size << ": " << r.to_string();
      std::vector<unsigned char> back(size);
      ASSERT_EQ(cudaMemcpy(back.data(), device, size, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(back, pattern) << "device buffer through " << tier_name(tier) << ", " << size << " bytes";
      // pinned and pageable host buffers read what the device buffer wrote
      std::memset(pinned, 0, size);
      ASSERT_TRUE(client->read(at, pinned, size).ok());
      EXPECT_EQ(std::memcmp(pinned, pattern.data(), size), 0) << "pinned, " << tier_name(tier);
      std::vector<unsigned char> pageable(size);
      ASSERT_TRUE(client->read(at, pageable.data(), size).ok());
      EXPECT_EQ(pageable, pattern) << "pageable, " << tier_name(tier);
      ASSERT_TRUE(client->free(a->gva).ok());
    }
    cudaFree(device);
    cudaFreeHost(pinned);
  }
}

TEST(DeviceBufferTest, AFreedDevicePointerIsAClearErrorAndTheProcessLives) {
  test::TestDaemon daemon({.vram = true, .vram_capacity = "64MiB"});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  auto client = daemon.connect();
  auto a = client->alloc(1 << 20, {.tier = Tier::dram});
  ASSERT_TRUE(a.ok());
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaFree(device), cudaSuccess);
  const Status w = client->write(a->gva, device, 1 << 20);
  EXPECT_EQ(w.code(), ErrorCode::invalid_argument) << w.to_string();
  EXPECT_NE(w.message().find("freed device pointer"), std::string::npos) << w.to_string();
  const Status r = client->read(a->gva, device, 1 << 20);
  EXPECT_EQ(r.code(), ErrorCode::invalid_argument) << r.to_string();
  std::vector<unsigned char> fine(1 << 20, 7);
  EXPECT_TRUE(client->write(a->gva, fine.data(), fine.size()).ok()) << "the client goes on";
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device here: the gpu suite is skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
