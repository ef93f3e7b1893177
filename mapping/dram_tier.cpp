// DRAM tier: a memfd, so co-located clients map the very same pages.
#include <cstring>

#include "common/shared_memory.hpp"
#include "mapping/tier_backend.hpp"

namespace tiermem {
namespace {

class DramTier final : public TierBackend {
 public:
  DramTier(SharedMemory memory, std::string name)
      : m_memory(std::move(memory)), m_name(std::move(name)) {}

  Tier tier() const override { return Tier::dram; }
  uint64_t capacity() const override { return m_memory.size(); }
  bool persistent() const override { return false; }
  std::string backing() const override { return m_memory.kind() + ":" + m_name; }
  std::byte* host_base() const override { return m_memory.data(); }
  void* region_base() const override { return m_memory.data(); }
  int share_fd() const override { return m_memory.fd(); }

  Status write(uint64_t offset, const void* src, size_t length) override {
    std::memcpy(m_memory.data() + offset, src, length);
    return Status();
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    std::memcpy(dst, m_memory.data() + offset, length);
    return Status();
  }
  Status persist(uint64_t, size_t) override { return Status(); }
  Status discard(uint64_t offset, size_t length) override {
    return m_memory.discard(offset, length);
  }

 private:
  SharedMemory m_memory;
  std::string m_name;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> make_dram_tier(uint64_t capacity, const std::string& name,
                                                    const SharedMemoryFactory& factory) {
  auto memory = factory ? factory(name, capacity) : SharedMemory::create(name, capacity);
  if (!memory.ok()) return memory.status().with_context("DRAM tier");
  return std::unique_ptr<TierBackend>(new DramTier(std::move(memory).value(), name));
}

}  // namespace tiermem
