// DRAM tier: one shared-memory file per domain (<dir>/dram.<k>, normally
// under /dev/shm), mapped side by side in the daemon; a co-located client of
// the domain's tenant maps the very same pages from the file's descriptor.
#include <cstring>
#include <mutex>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/shared_memory.hpp"
#include "mapping/segment_file.hpp"
#include "mapping/tier_backend.hpp"

namespace tiermem {
namespace {

class DramTier final : public TierBackend {
 public:
  DramTier(const SegmentedTierOptions& o, Reservation space)
      : m_dir(o.dir), m_capacity(o.capacity), m_span(domain_span_for(o.capacity)), m_space(std::move(space)),
        m_fds(o.domains), m_bytes(o.domains, 0) {}

  Tier tier() const override { return Tier::dram; }
  uint64_t capacity() const override { return m_capacity; }
  bool persistent() const override { return false; }
  std::string backing() const override { return m_dir; }
  uint32_t domains() const override { return static_cast<uint32_t>(m_bytes.size()); }
  bool per_domain() const override { return true; }
  uint64_t domain_span() const override { return m_span; }
  uint64_t domain_bytes(uint32_t d) const override {
    std::lock_guard lock(m_mutex);
    return d < m_bytes.size() ? m_bytes[d] : 0;
  }
  bool domain_file_exists(uint32_t d, uint64_t bytes) const override {
    return segment_file_exists(m_dir + "/dram." + std::to_string(d), bytes);
  }
  Status open_domain(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    bool done = false;
    TIERMEM_RETURN_IF_ERROR(
        check_open_domain("DRAM", d, bytes, m_bytes.size(), m_span, d < m_bytes.size() ? m_bytes[d] : 0, &done));
    if (done) return Status();
    TIERMEM_ASSIGN_OR_RETURN(auto fd, open_segment(m_dir + "/dram." + std::to_string(d), bytes));
    TIERMEM_RETURN_IF_ERROR(m_space.map(uint64_t{d} * m_span, bytes, fd.get(), 0));
    m_fds[d] = std::move(fd);
    m_bytes[d] = bytes;
    return Status();
  }
  std::byte* host_base() const override { return m_space.base(); }
  void* region_base() const override { return m_space.base(); }
  int share_fd(uint32_t d) const override {
    std::lock_guard lock(m_mutex);
    return d < m_fds.size() ? m_fds[d].get() : -1;
  }

  Status write(uint64_t offset, const void* src, size_t length) override {
    std::memcpy(m_space.base() + offset, src, length);
    return Status();
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    std::memcpy(dst, m_space.base() + offset, length);
    return Status();
  }
  Status persist(uint64_t, size_t) override { return Status(); }
  Status discard(uint64_t offset, size_t length) override {
    const uint32_t d = domain_of(offset);
    return punch_hole(share_fd(d), offset % m_span, length, m_space.base() + offset - offset % m_span);
  }
  Status commit(uint64_t offset, size_t length) override {
    return commit_file_range(share_fd(domain_of(offset)), offset % m_span, length, "the DRAM tier's files in " + m_dir);
  }

 private:
  std::string m_dir;
  uint64_t m_capacity;
  uint64_t m_span;
  Reservation m_space;
  mutable std::mutex m_mutex;  // domains opening while others are in use
  std::vector<UniqueFd> m_fds;
  std::vector<uint64_t> m_bytes;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> make_dram_tier(const SegmentedTierOptions& options) {
  if (options.capacity == 0 || options.domains == 0) {
    return Status(ErrorCode::invalid_argument, "the DRAM tier needs a capacity and at least one domain");
  }
  const uint64_t span = domain_span_for(options.capacity);
  TIERMEM_ASSIGN_OR_RETURN(auto space, Reservation::reserve(span * options.domains, "the DRAM tier"));
  return std::unique_ptr<TierBackend>(new DramTier(options, std::move(space)));
}

}  // namespace tiermem
