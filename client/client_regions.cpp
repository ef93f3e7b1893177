// ClientCore's local memory (LocalRegions, local_regions.hpp), reached only
// with direct access on, and device pointers into this node's VRAM.
#include <utility>
#include <vector>

#include <tiermem/status_macros.h>

#include "client/client_core.hpp"

namespace tiermem::detail {

Result<VersionWords*> ClientCore::local_versions(uint64_t first_page) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  return m_local.versions(first_page);
}

Result<IntentLog> ClientCore::intents() { return m_local.intents(); }

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
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_ASSIGN_OR_RETURN(DeviceFrameData * f, m_local.device_frames());
  return f->address(extents.front().frame_offset, length);
}

Result<FrameData*> ClientCore::local_frames(Tier tier) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  return m_local.frames(tier);
}

Result<std::pair<int, uint64_t>> ClientCore::tier_file(Tier tier, uint64_t frame_offset, uint64_t length) {
  return m_local.tier_file(tier, frame_offset, length);
}

bool ClientCore::region_persistent(Tier tier) const { return m_local.persistent(tier); }

}  // namespace tiermem::detail
