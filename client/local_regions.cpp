// LocalRegions: this node's memory of a client's tenant, mapped (see
// local_regions.hpp).
#include "client/local_regions.hpp"

#include <vector>

#include <tiermem/status_macros.h>

namespace tiermem::detail {

Status LocalRegions::open() {
  // Mapped already (every call after the first): one load.
  if (m_regions_mapped.load(std::memory_order_acquire) != nullptr) return Status();
  std::call_once(m_regions_once, [this] {
    std::vector<UniqueFd> fds;
    auto response = m_daemon.open_regions(&fds);
    if (!response.ok()) {
      m_regions_status = response.status();
      return;
    }
    auto regions = std::make_unique<NodeRegions>(m_hello, m_socket, m_daemon_lost);
    m_regions_status = regions->map(*response, fds);
    if (!m_regions_status.ok()) return;
    m_regions = std::move(regions);
    m_regions_mapped.store(m_regions.get(), std::memory_order_release);
  });
  return m_regions_status;
}

Result<VersionWords*> LocalRegions::versions(uint64_t first_page) {
  TIERMEM_RETURN_IF_ERROR(open());
  return m_regions->versions(first_page);
}

Result<IntentLog> LocalRegions::intents() {
  TIERMEM_RETURN_IF_ERROR(open());
  return m_regions->intents();
}

Result<DeviceFrameData*> LocalRegions::device_frames() {
  TIERMEM_RETURN_IF_ERROR(open());
  std::call_once(m_device_once, [this] {
    if (m_regions->device_windows().empty()) {
      m_device_status = Status(ErrorCode::not_supported, "tiermemd shares no VRAM with this client");
      return;
    }
    auto fetch = [this](uint64_t offset, uint64_t length) {
      return m_daemon.device_chunks(Tier::vram, offset, length);
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

Result<FrameData*> LocalRegions::frames(Tier tier) {
  if (tier == Tier::vram) {
    TIERMEM_ASSIGN_OR_RETURN(DeviceFrameData * f, device_frames());
    return static_cast<FrameData*>(f);
  }
  TIERMEM_RETURN_IF_ERROR(open());
  return m_regions->frames(tier);
}

Result<std::pair<int, uint64_t>> LocalRegions::tier_file(Tier tier, uint64_t frame_offset, uint64_t length) {
  TIERMEM_RETURN_IF_ERROR(open());
  return m_regions->tier_file(tier, frame_offset, length);
}

bool LocalRegions::persistent(Tier tier) const {
  const NodeRegions* r = m_regions_mapped.load(std::memory_order_acquire);
  return r != nullptr && r->persistent(tier);
}

bool LocalRegions::daemon_died() const {
  const NodeRegions* r = m_regions_mapped.load(std::memory_order_acquire);
  return r != nullptr && r->daemon_died();
}

}  // namespace tiermem::detail
