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

namespace tiermem::detail {

// --- local memory --------------------------------------------------------------------

Status ClientCore::open_regions() {
  // Mapped already (every call after the first): one load.
  if (m_regions_mapped.load(std::memory_order_acquire) != nullptr) return Status();
  std::call_once(m_regions_once, [this] {
    std::vector<UniqueFd> fds;
    auto response = m_stub.open_regions(&fds);
    if (!response.ok()) {
      m_regions_status = response.status();
      return;
    }
    auto regions = std::make_unique<NodeRegions>(m_hello, m_socket, &m_daemon_lost);
    m_regions_status = regions->map(*response, fds);
    if (!m_regions_status.ok()) return;
    m_regions = std::move(regions);
    m_regions_mapped.store(m_regions.get(), std::memory_order_release);
  });
  return m_regions_status;
}

Result<VersionWords*> ClientCore::local_versions(uint64_t first_page) {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  return m_regions->versions(first_page);
}

Result<IntentLog> ClientCore::intents() {
  TIERMEM_RETURN_IF_ERROR(open_regions());
  return m_regions->intents();
}

Result<DeviceFrameData*> ClientCore::device_frames() {
  if (!m_direct) return Status(ErrorCode::not_supported, "direct access is off");
  TIERMEM_RETURN_IF_ERROR(open_regions());
  std::call_once(m_device_once, [this] {
    if (!m_regions || m_regions->device_windows().empty()) {
      m_device_status = Status(ErrorCode::not_supported, "tiermemd shares no VRAM with this client");
      return;
    }
    auto fetch = [this](uint64_t offset, uint64_t length) {
      return m_stub.device_chunks(Tier::vram, offset, length);
    };
    auto f = DeviceFrameData::open(m_regions->device_uuid(), m_regions->device_chunk(), m_regions->device_windows(),
                                   std::move(fetch));
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
  return m_regions->frames(tier);
}

Result<std::pair<int, uint64_t>> ClientCore::tier_file(Tier tier, uint64_t frame_offset, uint64_t length) {
  TIERMEM_RETURN_IF_ERROR(open_regions());
  return m_regions->tier_file(tier, frame_offset, length);
}

bool ClientCore::region_persistent(Tier tier) const {
  const NodeRegions* r = m_regions_mapped.load(std::memory_order_acquire);
  return r != nullptr && r->persistent(tier);
}

}  // namespace tiermem::detail
