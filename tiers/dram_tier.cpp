// DRAM tier: one shared-memory file per domain (<dir>/dram.<k>, normally
// under /dev/shm), mapped side by side in the daemon; a co-located client of
// the domain's tenant maps the very same pages from the file's descriptor.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/shared_memory.hpp"
#include "tiers/segment_file.hpp"
#include "tiers/tier_backend.hpp"

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
  uint64_t domain_file_bytes(uint32_t d) const override {
    return segment_file_bytes(m_dir + "/dram." + std::to_string(d));
  }
  void remove_domain_file(uint32_t d) override {
    std::error_code ec;
    std::filesystem::remove(m_dir + "/dram." + std::to_string(d), ec);
  }
  Result<SegmentTrim> trim_domain_file(uint32_t d, std::string* path) override {
    std::lock_guard lock(m_mutex);
    if (d >= m_bytes.size() || m_bytes[d] == 0) return SegmentTrim{};
    *path = m_dir + "/dram." + std::to_string(d);
    return m_trims.look(d, trim_segment(m_fds[d].get(), m_bytes[d], *path));
  }
  Result<SegmentTrim> trim_unopened(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    auto t = trim_segment_file(m_dir + "/dram." + std::to_string(d), bytes);
    m_trims.at_start(d, t);
    return t;
  }
  Status open_domain(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    bool done = false;
    TIERMEM_RETURN_IF_ERROR(
        check_open_domain("DRAM", d, bytes, m_bytes.size(), m_span, d < m_bytes.size() ? m_bytes[d] : 0, &done));
    if (done) return Status();
    const std::string path = m_dir + "/dram." + std::to_string(d);
    TIERMEM_ASSIGN_OR_RETURN(auto fd, open_segment(path, bytes));
    // Grown by its tenant before this start: its growth goes first, before
    // anything here needs storage of the file system it may have filled.
    TIERMEM_ASSIGN_OR_RETURN(const SegmentTrim trimmed, trim_segment(fd.get(), bytes, path));
    m_trims.at_start(d, trimmed);
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
    if (pinned(offset, length)) {
      // The device holds these pages: a hole would leave it the old ones.
      std::memset(m_space.base() + offset, 0, length);
      return Status();
    }
    const uint32_t d = domain_of(offset);
    return punch_hole(share_fd(d), offset % m_span, length, m_space.base() + offset - offset % m_span);
  }
  Status release(uint64_t offset, size_t length) override {
    // Pinned storage stays (the device holds it): cleared when handed out again.
    return pinned(offset, length) ? Status() : discard(offset, length);
  }
  Status commit(uint64_t offset, size_t length) override {
    // Pinned chunks got their storage as they were pinned; fallocate would
    // only walk their pages again (some 20 us per MiB on tmpfs, which a
    // migration into DRAM paid for every run).
    if (all_pinned(offset, length)) return Status();
    TIERMEM_RETURN_IF_ERROR(
        commit_file_range(share_fd(domain_of(offset)), offset % m_span, length, "the DRAM tier's files in " + m_dir));
    if (m_pin && length > 0) pin_range(offset, length);
    return Status();
  }
  void pin_with(HostPinner pin) override {
    std::lock_guard lock(m_mutex);
    m_pin = std::move(pin);
  }

 private:
  std::string m_dir;
  uint64_t m_capacity;
  uint64_t m_span;
  Reservation m_space;
  mutable std::mutex m_mutex;  // domains opening while others are in use
  // Pinned chunks are k_pin_chunk bytes from the start of their domain,
  // keyed by their first frame offset.
  uint64_t chunk_of(uint64_t offset) const {
    const uint64_t first = offset - offset % m_span;
    return first + (offset - first) / k_pin_chunk * k_pin_chunk;
  }
  // Whether any of [offset, +length) lies in a pinned chunk.
  bool pinned(uint64_t offset, uint64_t length) const {
    std::lock_guard lock(m_mutex);
    if (m_pinned.empty()) return false;
    auto it = m_pinned.upper_bound(offset);
    if (it != m_pinned.begin() && *std::prev(it) + k_pin_chunk > offset) return true;
    return it != m_pinned.end() && *it < offset + length;
  }
  // Whether every chunk of [offset, +length) is pinned.
  bool all_pinned(uint64_t offset, uint64_t length) const {
    std::lock_guard lock(m_mutex);
    if (m_pinned.empty() || length == 0) return false;
    for (uint64_t c = chunk_of(offset); c < offset + length; c += k_pin_chunk) {
      if (m_pinned.count(c) == 0) return false;
    }
    return true;
  }
  // Pins the chunks of [offset, +length) not pinned yet (within the domain's
  // file). A chunk that cannot be pinned is left to pageable copies: the
  // tier works either way, only slower.
  void pin_range(uint64_t offset, uint64_t length) {
    std::lock_guard lock(m_mutex);
    const uint32_t d = domain_of(offset);
    const uint64_t domain_end = uint64_t{d} * m_span + m_bytes[d];
    for (uint64_t c = chunk_of(offset); c < offset + length; c += k_pin_chunk) {
      if (m_pinned.count(c) != 0 || m_unpinnable.count(c) != 0) continue;
      const uint64_t end = std::min(c + k_pin_chunk, domain_end);
      if (end <= c) continue;
      // The whole chunk gets storage now: a pinned page must never be a hole.
      if (!commit_file_range(m_fds[d].get(), c % m_span, end - c, "the DRAM tier").ok() ||
          !m_pin(m_space.base() + c, end - c).ok()) {
        m_unpinnable.insert(c);
        continue;
      }
      m_pinned.insert(c);
    }
  }

  static constexpr uint64_t k_pin_chunk = 64ull << 20;
  DomainTrims m_trims;
  std::vector<UniqueFd> m_fds;
  std::vector<uint64_t> m_bytes;
  HostPinner m_pin;
  std::set<uint64_t> m_pinned, m_unpinnable;  // by chunk_of
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
