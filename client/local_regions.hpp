// This node's memory of a client's tenant, mapped into the client's process
// (internal): the regions of its domain the daemon hands over (version words,
// DRAM and PMEM files, the lock log, the VRAM windows), mapped once on first
// use, and the VRAM frames imported on first use. What fails to map is
// remembered and returned to every later caller (nothing is asked twice).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "client/device_frames.hpp"
#include "client/node_regions.hpp"
#include "pages/lock_intents.hpp"
#include "proto/control_stub.hpp"

namespace tiermem::detail {

class LocalRegions {
 public:
  // `daemon`, `hello`, `daemon_lost`: of the client's session (they outlive
  // this); `socket`: the daemon's, for messages.
  LocalRegions(ControlStub& daemon, const proto::HelloResponse& hello, std::string socket,
               const std::atomic<bool>* daemon_lost)
      : m_daemon(daemon), m_hello(hello), m_socket(std::move(socket)), m_daemon_lost(daemon_lost) {}

  // Maps the regions (the first call; later ones return its outcome).
  Status open();
  Result<VersionWords*> versions(uint64_t first_page);
  // The session's lock log (pages/lock_intents.hpp).
  Result<IntentLog> intents();
  // Frames of `tier` (VRAM: imported).
  Result<FrameData*> frames(Tier tier);
  // This client's VRAM frames. Errors: not_supported when the daemon shares none.
  Result<DeviceFrameData*> device_frames();
  // The file holding frames [frame_offset, +length) of `tier`, and the offset in it.
  Result<std::pair<int, uint64_t>> tier_file(Tier tier, uint64_t frame_offset, uint64_t length);
  // Without mapping anything (false until mapped):
  bool persistent(Tier tier) const;
  // Whether the daemon that handed the regions over is gone (its headers say so).
  bool daemon_died() const;
  // The CUDA device ordinal of imported VRAM (-1: none).
  int device_ordinal() const { return m_device_frames ? m_device_frames->device() : -1; }

 private:
  ControlStub& m_daemon;
  const proto::HelloResponse& m_hello;
  const std::string m_socket;
  const std::atomic<bool>* m_daemon_lost;

  std::once_flag m_regions_once;
  Status m_regions_status;
  std::unique_ptr<NodeRegions> m_regions;  // once open() mapped them
  // The same, for threads that did not go through open() (the watcher):
  // null until they are mapped.
  std::atomic<const NodeRegions*> m_regions_mapped{nullptr};
  std::once_flag m_device_once;
  Status m_device_status;
  std::unique_ptr<DeviceFrameData> m_device_frames;
};

}  // namespace tiermem::detail
