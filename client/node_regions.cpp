#include "client/node_regions.hpp"

#include <atomic>

#include <tiermem/status_macros.h>

#include "convert.hpp"

namespace tiermem::detail {

Status DomainVersionWords::check_owner() {
  // seq_cst, after the page locks were taken (their CAS is seq_cst too): a
  // daemon that retires the segment first and then looks for locks either
  // sees ours or we see its retirement.
  const uint64_t incarnation = std::atomic_ref<const uint64_t>(*m_incarnation).load(std::memory_order_seq_cst);
  // The kernel marks the daemon's liveness word as its process exits
  // (SegmentHeader::alive), earlier than the watcher sees the socket close.
  if (m_daemon_lost->load(std::memory_order_seq_cst) ||
      owner_died(std::atomic_ref<const uint32_t>(*m_alive).load(std::memory_order_seq_cst))) {
    return Status(m_gone, "tiermemd at " + m_socket + " is gone; nothing was written");
  }
  if (incarnation != m_expected) {
    return Status(m_gone, "the memory this client mapped is no longer served by the tiermemd at " +
                                              m_socket + " it connected to (the daemon restarted, or the segment "
                                              "was retired); nothing was written: connect again");
  }
  return Status();
}

DomainFrameData::File* DomainFrameData::file_of(uint64_t frame_offset, uint64_t* in_file) {
  // The file starting last at or before the offset (the frames then must lie
  // in it: MappedFrameData checks its length).
  File* best = nullptr;
  for (File& f : m_files) {
    if (frame_offset >= f.first && (best == nullptr || f.first > best->first)) best = &f;
  }
  if (best != nullptr) *in_file = frame_offset - best->first;
  return best;
}

Status DomainFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  uint64_t at = 0;
  File* f = file_of(frame_offset, &at);
  return f == nullptr ? stale_translation() : f->frames.read(at, dst, length);
}

Status DomainFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  uint64_t at = 0;
  File* f = file_of(frame_offset, &at);
  return f == nullptr ? stale_translation() : f->frames.write(at, src, length);
}

Status DomainFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old) {
  uint64_t at = 0;
  File* f = file_of(frame_offset, &at);
  return f == nullptr ? stale_translation() : f->frames.atomic(at, op, operand, compare, old);
}

// --- NodeRegions ---------------------------------------------------------------------

Status NodeRegions::map(const proto::OpenRegionsResponse& regions, std::vector<UniqueFd>& fds) {
  size_t next_fd = 0;
  const uint64_t per_domain = m_hello.pages_per_domain();
  for (const proto::Region& r : regions.regions()) {
    if (r.kind() == proto::Region::TIER && wire::from_proto(r.tier()) == Tier::vram && !r.has_fd()) {
      // Device memory: imported chunk by chunk when first touched.
      m_device_uuid = r.device_uuid();
      m_device_chunk = r.chunk_bytes();
      m_device_windows.push_back({r.first(), r.length()});
      continue;
    }
    if (!r.has_fd()) continue;
    if (next_fd >= fds.size()) return Status(ErrorCode::internal, "tiermemd sent fewer descriptors than regions");
    UniqueFd fd = std::move(fds[next_fd++]);
    if (r.kind() == proto::Region::HEADER) {
      if (r.length() != k_segment_header_bytes) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent a segment header of the wrong size");
      }
      TIERMEM_ASSIGN_OR_RETURN(auto header, MappedRegion::map_read_only(fd.get(), r.length()));
      m_headers.emplace_back(r.domain(), std::move(header));
      continue;
    }
    if (r.kind() == proto::Region::TIER && r.persistent()) {
      map_persistent_tier(r, std::move(fd));
      continue;
    }
    TIERMEM_ASSIGN_OR_RETURN(auto map, MappedRegion::map(fd.get(), r.length()));
    if (r.kind() == proto::Region::INTENTS) {
      if (r.length() != k_intent_log_bytes) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent a lock log of the wrong size");
      }
      m_intents_map = std::move(map);
      continue;
    }
    if (r.kind() == proto::Region::VERSIONS) {
      if (per_domain == 0 || r.length() < 3 * per_domain * sizeof(uint64_t)) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent a version segment of the wrong size");
      }
      const SegmentHeader* header = header_of(r.domain());
      if (header == nullptr) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent version words without their segment header");
      }
      if (std::atomic_ref<const uint64_t>(header->magic).load(std::memory_order_acquire) != SegmentHeader::k_magic ||
          std::atomic_ref<const uint64_t>(header->incarnation).load(std::memory_order_acquire) !=
              m_hello.incarnation()) {
        // Not (or no longer) the serving daemon's: the domain's memory is
        // reached through the daemon instead.
        continue;
      }
      MappedDomain& d = m_domains.emplace_back();
      d.domain = r.domain();
      d.versions = std::move(map);
      auto* words = reinterpret_cast<uint64_t*>(d.versions.data());
      d.words.emplace(words, per_domain, words + per_domain, m_hello.page_size(), r.first(), &header->incarnation,
                      alive_word(*header), m_hello.incarnation(), m_daemon_lost, m_socket,
                      m_sibling ? ErrorCode::transport_error : ErrorCode::unavailable);
      continue;
    }
    const auto tier = static_cast<size_t>(wire::from_proto(r.tier()));
    if (tier == 0 || tier >= 4) return Status(ErrorCode::malformed_frame, "tiermemd sent a region of no tier");
    if (!m_frames[tier]) m_frames[tier].emplace(r.persistent());
    m_frames[tier]->add(r.first(), map.data(), map.size());
    m_files[tier].push_back({r.domain(), r.first(), std::move(fd), std::move(map)});
  }
  return Status();
}

void NodeRegions::map_persistent_tier(const proto::Region& r, UniqueFd fd) {
  const auto tier = static_cast<size_t>(wire::from_proto(r.tier()));
  if (tier == 0 || tier >= 4) return;
  // Mapped with libpmem2, as the daemon maps it: stores become durable the
  // way libpmem2 chooses for the file (cache flushes on DAX, msync
  // elsewhere), and a DAX file is mapped at an address that takes huge pages.
  // A file it cannot map here (cut short by the tenant meanwhile) is left
  // out: its frames are then reached through the daemon.
  auto pmem = PmemMap::map(fd.get(), r.length(), "the PMEM file of domain " + std::to_string(r.domain()));
  if (!pmem.ok()) return;
  if (!m_frames[tier]) m_frames[tier].emplace(true);
  m_frames[tier]->add(r.first(), pmem->data(), pmem->size(), pmem->durability());
  TierFile& f = m_files[tier].emplace_back();
  f.domain = r.domain();
  f.first = r.first();
  f.fd = std::move(fd);
  f.map = MappedRegion(pmem->data(), pmem->size(), false);
  f.pmem = std::move(pmem).value();
}

const SegmentHeader* NodeRegions::header_of(uint32_t domain) const {
  for (const auto& [d, region] : m_headers) {
    if (d == domain) return reinterpret_cast<const SegmentHeader*>(region.data());
  }
  return nullptr;
}

Result<VersionWords*> NodeRegions::versions(uint64_t first_page) {
  const uint64_t per_domain = m_hello.pages_per_domain();
  for (MappedDomain& d : m_domains) {
    if (per_domain != 0 && first_page / per_domain == d.domain) return static_cast<VersionWords*>(&*d.words);
  }
  return Status(ErrorCode::not_supported, "page " + std::to_string(first_page) + " of node " +
                                              std::to_string(m_hello.node_id()) +
                                              " is of another tenant's domain: not mapped here");
}

Result<FrameData*> NodeRegions::frames(Tier tier) {
  auto& f = m_frames[static_cast<size_t>(tier)];
  if (!f) {
    return Status(ErrorCode::not_supported,
                  "the " + std::string(tier_name(tier)) + " tier cannot be mapped into a client");
  }
  return static_cast<FrameData*>(&*f);
}

Result<IntentLog> NodeRegions::intents() {
  if (m_intents_map.data() == nullptr) {
    return Status(ErrorCode::not_supported, "tiermemd gave this session no lock log: locks go through it");
  }
  return IntentLog(m_intents_map.data());
}

Result<std::pair<int, uint64_t>> NodeRegions::tier_file(Tier tier, uint64_t frame_offset, uint64_t length) const {
  for (const TierFile& f : m_files[static_cast<size_t>(tier)]) {
    if (frame_offset >= f.first && frame_offset - f.first + length <= f.map.size()) {
      return std::pair<int, uint64_t>(f.fd.get(), frame_offset - f.first);
    }
  }
  return Status(ErrorCode::not_supported,
                "the " + std::string(tier_name(tier)) + " frames at " + std::to_string(frame_offset) +
                    " are not in a file this client may map");
}

bool NodeRegions::persistent(Tier tier) const {
  const auto& f = m_frames[static_cast<size_t>(tier)];
  return f && f->persistent();
}

uint64_t NodeRegions::memory_generation(Tier tier, uint64_t frame_offset) const {
  for (const TierFile& f : m_files[static_cast<size_t>(tier)]) {
    if (frame_offset < f.first || frame_offset - f.first >= f.map.size()) continue;
    const SegmentHeader* h = header_of(f.domain);
    return h == nullptr ? 0 : std::atomic_ref<const uint64_t>(h->memory_generation).load(std::memory_order_acquire);
  }
  return 0;
}

bool NodeRegions::daemon_died() const {
  for (const auto& [domain, region] : m_headers) {
    const auto* h = reinterpret_cast<const SegmentHeader*>(region.data());
    if (owner_died(std::atomic_ref<const uint32_t>(*alive_word(*h)).load(std::memory_order_seq_cst)) ||
        std::atomic_ref<const uint64_t>(h->incarnation).load(std::memory_order_seq_cst) != m_hello.incarnation()) {
      return true;
    }
  }
  return false;
}

}  // namespace tiermem::detail
