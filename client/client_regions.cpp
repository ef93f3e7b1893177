// ClientCore's local memory: the regions of its tenant's domain the daemon
// hands it (version words, DRAM and PMEM files, the lock log, the VRAM
// windows), mapped once, and the VRAM frames imported on first use.
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/status_macros.h>

#include "client/client_core.hpp"
#include "convert.hpp"
#include "mapping/version_segments.hpp"

namespace tiermem::detail {

// --- local memory --------------------------------------------------------------------

Status ClientCore::map_regions(const proto::OpenRegionsResponse& regions, std::vector<UniqueFd>& fds) {
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
      const SegmentHeader* header = nullptr;
      for (const auto& [domain, h] : m_headers) {
        if (domain == r.domain()) header = reinterpret_cast<const SegmentHeader*>(h.data());
      }
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
      auto* base = d.versions.data();
      auto* words = reinterpret_cast<uint64_t*>(base);
      d.words.emplace(words, per_domain, words + per_domain, page_size(), r.first(), &header->incarnation,
                      alive_word(*header), m_hello.incarnation(), &m_daemon_lost, m_socket);
      continue;
    }
    const auto tier = static_cast<size_t>(wire::from_proto(r.tier()));
    if (tier == 0 || tier >= 4) return Status(ErrorCode::malformed_frame, "tiermemd sent a region of no tier");
    if (!m_local_frames[tier]) m_local_frames[tier].emplace(r.persistent());
    m_local_frames[tier]->add(r.first(), map.data(), map.size());
    m_files[tier].push_back({r.domain(), r.first(), std::move(fd), std::move(map)});
  }
  return Status();
}

Status ClientCore::open_regions() {
  std::call_once(m_regions_once, [this] {
    proto::Request request;
    request.mutable_open_regions();
    std::vector<UniqueFd> fds;
    auto response = call(request, &fds);
    m_regions_status = response.ok() ? map_regions(response->open_regions(), fds) : response.status();
  });
  return m_regions_status;
}

Result<VersionWords*> ClientCore::local_versions(uint64_t first_page) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  const uint64_t per_domain = m_hello.pages_per_domain();
  for (MappedDomain& d : m_domains) {
    if (per_domain != 0 && first_page / per_domain == d.domain) return static_cast<VersionWords*>(&*d.words);
  }
  return Status(ErrorCode::not_supported, "page " + std::to_string(first_page) +
                                              " is of another tenant's domain: not mapped here");
}

Result<IntentLog> ClientCore::intents() {
  TIERMEM_RETURN_IF_ERROR(open_regions());
  if (m_intents_map.data() == nullptr) {
    return Status(ErrorCode::not_supported, "tiermemd gave this session no lock log: locks go through it");
  }
  return IntentLog(m_intents_map.data());
}

Result<DeviceFrameData*> ClientCore::device_frames() {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  std::call_once(m_device_once, [this] {
    if (m_device_windows.empty()) {
      m_device_status = Status(ErrorCode::not_supported, "tiermemd shares no VRAM with this client");
      return;
    }
    auto fetch = [this](uint64_t offset, uint64_t length) -> Result<std::vector<std::pair<uint64_t, UniqueFd>>> {
      proto::Request request;
      proto::DeviceChunksRequest* r = request.mutable_device_chunks();
      r->set_tier(wire::to_proto(Tier::vram));
      r->set_frame_offset(offset);
      r->set_length(length);
      std::vector<UniqueFd> fds;
      TIERMEM_ASSIGN_OR_RETURN(auto response, call(request, &fds));
      const auto& offsets = response.device_chunks().frame_offsets();
      if (static_cast<size_t>(offsets.size()) != fds.size()) {
        return Status(ErrorCode::malformed_frame, "tiermemd sent VRAM chunks and descriptors that do not pair up");
      }
      std::vector<std::pair<uint64_t, UniqueFd>> out;
      for (int i = 0; i < offsets.size(); ++i) out.emplace_back(offsets[i], std::move(fds[static_cast<size_t>(i)]));
      return out;
    };
    auto f = DeviceFrameData::open(m_device_uuid, m_device_chunk, m_device_windows, std::move(fetch));
    if (f.ok()) {
      m_device_frames = std::move(f).value();
    } else {
      m_device_status = f.status();
    }
  });
  if (!m_device_frames) return m_device_status;
  return m_device_frames.get();
}

Result<std::byte*> ClientCore::device_address(const std::vector<Extent>& extents) {
  if (extents.empty()) return Status(ErrorCode::invalid_argument, "no extents");
  uint64_t length = 0;
  for (const Extent& x : extents) {
    if (x.node != node() || x.tier != Tier::vram) {
      return Status(ErrorCode::not_supported, "only VRAM of this node maps to a device pointer");
    }
    if (x.gva_offset != extents.front().gva_offset + length ||
        x.frame_offset != extents.front().frame_offset + length) {
      return Status(ErrorCode::not_supported,
                    "the allocation's VRAM frames are not contiguous: read and write it instead of mapping it");
    }
    length += x.length;
  }
  TIERMEM_ASSIGN_OR_RETURN(DeviceFrameData * f, device_frames());
  return f->address(extents.front().frame_offset, length);
}

Result<FrameData*> ClientCore::local_frames(Tier tier) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  if (tier == Tier::vram) {
    TIERMEM_ASSIGN_OR_RETURN(DeviceFrameData * f, device_frames());
    return static_cast<FrameData*>(f);
  }
  TIERMEM_RETURN_IF_ERROR(open_regions());
  auto& f = m_local_frames[static_cast<size_t>(tier)];
  if (!f) {
    return Status(ErrorCode::not_supported,
                  "the " + std::string(tier_name(tier)) + " tier cannot be mapped into a client");
  }
  return static_cast<FrameData*>(&*f);
}

Result<std::pair<int, uint64_t>> ClientCore::tier_file(Tier tier, uint64_t frame_offset, uint64_t length) {
  TIERMEM_RETURN_IF_ERROR(open_regions());
  for (const TierFile& f : m_files[static_cast<size_t>(tier)]) {
    if (frame_offset >= f.first && frame_offset - f.first + length <= f.map.size()) {
      return std::pair<int, uint64_t>(f.fd.get(), frame_offset - f.first);
    }
  }
  return Status(ErrorCode::not_supported,
                "the " + std::string(tier_name(tier)) + " frames at " + std::to_string(frame_offset) +
                    " are not in a file this client may map");
}

bool ClientCore::region_persistent(Tier tier) const {
  const auto& f = m_local_frames[static_cast<size_t>(tier)];
  return f && f->persistent();
}

}  // namespace tiermem::detail
