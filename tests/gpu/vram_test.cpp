// The VRAM tier on a real GPU (suite `gpu`; run on the device machine). Exits
// 77 (skipped) where no CUDA device is present.
#include <cuda_runtime_api.h>

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include <tiermem/client.h>

#include "mapping/address_space.hpp"
#include "mapping/tier_backend.hpp"
#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

TEST(VramTierTest, WriteReadDiscardAndCopyFromDram) {
  auto vram = make_vram_tier(0, 64 << 20);
  ASSERT_TRUE(vram.ok()) << vram.status().to_string();
  EXPECT_EQ((*vram)->tier(), Tier::vram);
  EXPECT_EQ((*vram)->host_base(), nullptr);
  EXPECT_NE((*vram)->region_base(), nullptr);
  EXPECT_EQ((*vram)->ipc_handle().size(), sizeof(cudaIpcMemHandle_t));
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
  auto a = client->alloc(10 << 20, {.tier = Tier::vram, .strict = true});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  std::vector<unsigned char> out(10 << 20), in(10 << 20);
  std::iota(out.begin(), out.end(), 11);
  ASSERT_TRUE(client->write(a->gva, out.data(), out.size()).ok());
  ASSERT_TRUE(client->read(a->gva, in.data(), in.size()).ok());
  EXPECT_EQ(in, out);
  auto t = client->translate(a->gva);
  EXPECT_EQ(t->page.tier, Tier::vram);
  EXPECT_EQ(client->map(a->gva).status().code(), ErrorCode::not_supported);
  const auto r = test::run_ctl(daemon.socket(), {"alloc", "4MiB", "--tier", "vram", "--strict"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(client->free(a->gva).ok());
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
