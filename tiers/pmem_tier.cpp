// PMEM tier: one pool file per domain (<dir>/pmem.<k>), mapped with libpmem2
// (PmemMap) side by side inside one libpmem2 address reservation. On a DAX
// file system stores are made durable with cache flushes; on an ordinary file
// libpmem2 falls back to msync (page store granularity is accepted, so both
// work with the same code). A co-located client maps the same files the same
// way (client/client_regions.cpp), so its stores become durable as the
// daemon's do.
#include <libpmem2.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "pages/pmem_map.hpp"
#include "tiers/segment_file.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem {
namespace {

Status pmem2_error(const std::string& what) { return Status(ErrorCode::io_error, what + ": " + pmem2_errormsg()); }

struct PmemDomain {
  UniqueFd fd;
  PmemMap map;
  uint64_t bytes = 0;
  TruncationGuard guard;  // while mapped
};

class PmemTier final : public TierBackend {
 public:
  PmemTier(const SegmentedTierOptions& o, pmem2_vm_reservation* rsv)
      : m_dir(o.dir), m_capacity(o.capacity), m_span(domain_span_for(o.capacity)), m_rsv(rsv),
        m_base(static_cast<std::byte*>(pmem2_vm_reservation_get_address(rsv))), m_domains(o.domains) {}
  ~PmemTier() override {
    for (PmemDomain& d : m_domains) {
      d.guard = TruncationGuard();
      d.map = PmemMap();  // every mapping goes before the reservation can
    }
    pmem2_vm_reservation_delete(&m_rsv);
  }

  Tier tier() const override { return Tier::pmem; }
  uint64_t capacity() const override { return m_capacity; }
  bool persistent() const override { return true; }
  std::string backing() const override { return m_dir; }
  uint32_t domains() const override { return static_cast<uint32_t>(m_domains.size()); }
  bool per_domain() const override { return true; }
  uint64_t domain_span() const override { return m_span; }
  uint64_t domain_bytes(uint32_t d) const override {
    std::lock_guard lock(m_mutex);
    return d < m_domains.size() ? m_domains[d].bytes : 0;
  }
  uint64_t domain_file_bytes(uint32_t d) const override {
    return segment_file_bytes(m_dir + "/pmem." + std::to_string(d));
  }
  void remove_domain_file(uint32_t d) override {
    std::error_code ec;
    std::filesystem::remove(m_dir + "/pmem." + std::to_string(d), ec);
  }
  Result<SegmentTrim> trim_domain_file(uint32_t d, std::string* path) override {
    std::lock_guard lock(m_mutex);
    if (d >= m_domains.size() || m_domains[d].bytes == 0) return SegmentTrim{};
    *path = m_dir + "/pmem." + std::to_string(d);
    return m_trims.look(d, trim_segment(m_domains[d].fd.get(), m_domains[d].bytes, *path));
  }
  Result<SegmentTrim> trim_unopened(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    auto t = trim_segment_file(m_dir + "/pmem." + std::to_string(d), bytes);
    m_trims.at_start(d, t);
    return t;
  }
  Status open_domain(uint32_t d, uint64_t bytes) override {
    std::lock_guard lock(m_mutex);
    bool done = false;
    TIERMEM_RETURN_IF_ERROR(check_open_domain("PMEM", d, bytes, m_domains.size(), m_span,
                                              d < m_domains.size() ? m_domains[d].bytes : 0, &done));
    if (done) return Status();
    PmemDomain& dom = m_domains[d];
    const std::string path = m_dir + "/pmem." + std::to_string(d);
    TIERMEM_ASSIGN_OR_RETURN(dom.fd, open_segment(path, bytes));
    // Grown by its tenant before this start: its growth goes first, before
    // anything here needs storage of the file system it may have filled.
    TIERMEM_ASSIGN_OR_RETURN(const SegmentTrim trimmed, trim_segment(dom.fd.get(), bytes, path));
    m_trims.at_start(d, trimmed);
    TIERMEM_ASSIGN_OR_RETURN(dom.map, PmemMap::map(dom.fd.get(), bytes, "PMEM pool " + path, m_rsv, uint64_t{d} * m_span));
    TIERMEM_ASSIGN_OR_RETURN(dom.guard, TruncationGuard::watch(m_base + uint64_t{d} * m_span, bytes, dom.fd.get(), 0));
    dom.bytes = bytes;
    return Status();
  }
  std::byte* host_base() const override { return m_base; }
  void* region_base() const override { return m_base; }
  int share_fd(uint32_t d) const override {
    std::lock_guard lock(m_mutex);
    return d < m_domains.size() ? m_domains[d].fd.get() : -1;
  }

  Status write(uint64_t offset, const void* src, size_t length) override {
    domain(offset).map.copy_durable(m_base + offset, src, length);
    return Status();
  }
  Status read(uint64_t offset, void* dst, size_t length) const override {
    std::memcpy(dst, m_base + offset, length);
    return Status();
  }
  Status persist(uint64_t offset, size_t length) override {
    domain(offset).map.persist(m_base + offset, length);
    return Status();
  }
  Status discard(uint64_t offset, size_t length) override {
    return punch_hole(domain(offset).fd.get(), offset % m_span, length, m_base + offset - offset % m_span);
  }
  Status commit(uint64_t offset, size_t length) override {
    return commit_file_range(domain(offset).fd.get(), offset % m_span, length, "the PMEM pool " + m_dir);
  }

 private:
  // Domains are open when their frames are in use: no lock needed to read
  // what open_domain wrote before it returned (the allocation that hands the
  // frames out happens after, under the address space's lock).
  const PmemDomain& domain(uint64_t offset) const { return m_domains[offset / m_span]; }

  std::string m_dir;
  uint64_t m_capacity;
  uint64_t m_span;
  pmem2_vm_reservation* m_rsv;
  std::byte* m_base;
  mutable std::mutex m_mutex;
  std::vector<PmemDomain> m_domains;
  DomainTrims m_trims;
};

}  // namespace

Result<std::unique_ptr<TierBackend>> make_pmem_tier(const SegmentedTierOptions& options) {
  if (options.dir.empty()) return Status(ErrorCode::invalid_argument, "the PMEM tier needs a directory");
  if (options.capacity == 0 || options.domains == 0) {
    return Status(ErrorCode::invalid_argument, "the PMEM tier needs a capacity and at least one domain");
  }
  pmem2_vm_reservation* rsv = nullptr;
  const uint64_t span = domain_span_for(options.capacity);
  if (pmem2_vm_reservation_new(&rsv, nullptr, span * options.domains) != 0) {
    return pmem2_error("reserving " + format_size(span * options.domains) + " of address space for the PMEM tier");
  }
  return std::unique_ptr<TierBackend>(new PmemTier(options, rsv));
}

}  // namespace tiermem
