// The memory of one node that a client maps (internal): what that node's
// daemon hands a session of this client after checking who it is — the
// files of its tenant's domain (segment header, read-only; version words;
// DRAM and PMEM frames), the session's lock log, and where its VRAM is.
// The client's own node's daemon hands them over, and so does any daemon on
// the same host (common/host_id.hpp), so that memory homed there is read
// and written as memory of the client's own node is: by memcpy under the
// page versions, with no daemon and no fabric in between.
//
// Mapped once (map()); not movable after (the version words point into it).
// Thread-safe once mapped: everything below only reads its state.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/status.h>
#include <tiermem/types.h>

#include "client/device_frames.hpp"
#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "control.pb.h"
#include "pages/lock_intents.hpp"
#include "pages/seqlock_copy.hpp"
#include "pages/segment_layout.hpp"

namespace tiermem::detail {

// Version words of one mapped domain, which also answer whether the daemon
// that serves them is still the one this client connected to.
class DomainVersionWords final : public LocalVersionWords {
 public:
  DomainVersionWords(uint64_t* words, size_t count, uint64_t* l3, uint64_t page_size, uint64_t first,
                     const uint64_t* incarnation_word, const uint32_t* alive_word, uint64_t expected,
                     const std::atomic<bool>* daemon_lost, std::string socket, ErrorCode gone)
      : LocalVersionWords(words, count, l3, page_size, first), m_incarnation(incarnation_word), m_alive(alive_word),
        m_expected(expected), m_daemon_lost(daemon_lost), m_socket(std::move(socket)), m_gone(gone) {}
  Status check_owner() override;

 private:
  const uint64_t* m_incarnation;
  const uint32_t* m_alive;  // SegmentHeader::alive's futex word
  uint64_t m_expected;
  const std::atomic<bool>* m_daemon_lost;
  std::string m_socket;
  ErrorCode m_gone;  // what a gone daemon is to the caller
};

// The frames of one tier in the domain files this client mapped.
class DomainFrameData final : public FrameData {
 public:
  explicit DomainFrameData(bool persistent) : m_persistent(persistent) {}
  void add(uint64_t first, std::byte* base, size_t length, Durability durability = {}) {
    m_files.push_back({first, {base, length, m_persistent, durability}});
  }
  Status read(uint64_t frame_offset, void* dst, size_t length) override;
  Status write(uint64_t frame_offset, const void* src, size_t length) override;
  Status atomic(uint64_t frame_offset, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old) override;
  bool persistent() const override { return m_persistent; }

 private:
  struct File {
    uint64_t first;  // frame offset of the file's first byte
    MappedFrameData frames;
  };
  // The file holding the frames, and the offset in it.
  File* file_of(uint64_t frame_offset, uint64_t* in_file);
  bool m_persistent;
  std::vector<File> m_files;
};

class NodeRegions {
 public:
  // Of the daemon at `socket` that said `hello`; `daemon_lost` is set (by
  // the owner) once its connection closed. `sibling`: another node's daemon
  // on this host, whose going away is a transport_error of that node (the
  // caller reaches it again), not unavailable (this client's own daemon).
  NodeRegions(const proto::HelloResponse& hello, std::string socket, const std::atomic<bool>* daemon_lost,
              bool sibling = false)
      : m_hello(hello), m_socket(std::move(socket)), m_daemon_lost(daemon_lost), m_sibling(sibling) {}
  NodeRegions(const NodeRegions&) = delete;
  NodeRegions& operator=(const NodeRegions&) = delete;

  // Maps what an open_regions answer and its descriptors hand over.
  // Errors: malformed_frame (what came does not fit together), io_error.
  Status map(const proto::OpenRegionsResponse& regions, std::vector<UniqueFd>& fds);

  // The version words of the domain holding `first_page`. Errors:
  // not_supported (another tenant's domain, or one whose segment was not
  // the serving daemon's when mapped).
  Result<VersionWords*> versions(uint64_t first_page);
  // The frames of a host tier (DRAM, PMEM). Errors: not_supported.
  Result<FrameData*> frames(Tier tier);
  // The session's lock log there. Errors: not_supported.
  Result<IntentLog> intents();
  // The file of a tier holding frames [frame_offset, +length): its
  // descriptor and the offset in it. Errors: not_supported.
  Result<std::pair<int, uint64_t>> tier_file(Tier tier, uint64_t frame_offset, uint64_t length) const;
  bool persistent(Tier tier) const;
  // The memory generation of the domain holding frame `frame_offset` of
  // `tier` (its segment header's), 0 when no mapped file holds it.
  uint64_t memory_generation(Tier tier, uint64_t frame_offset) const;
  // Whether the daemon that handed these over is gone (its process died, or
  // another serves the memory now), as the segment headers say.
  bool daemon_died() const;

  // VRAM has no files: where the daemon said it is, for ClientCore to import.
  const std::string& device_uuid() const { return m_device_uuid; }
  uint64_t device_chunk() const { return m_device_chunk; }
  const std::vector<DeviceWindow>& device_windows() const { return m_device_windows; }

 private:
  struct MappedDomain {
    uint32_t domain = 0;
    MappedRegion versions;  // words, L3 (its header is in m_headers)
    std::optional<DomainVersionWords> words;
  };
  struct TierFile {
    uint32_t domain = 0;
    uint64_t first = 0;
    UniqueFd fd;
    MappedRegion map;  // of `pmem` when set (not owned then)
    PmemMap pmem;      // a persistent tier's file, mapped with libpmem2
  };
  const SegmentHeader* header_of(uint32_t domain) const;
  // A persistent tier's file (PMEM), mapped with libpmem2.
  void map_persistent_tier(const proto::Region& r, UniqueFd fd);

  proto::HelloResponse m_hello;
  std::string m_socket;
  const std::atomic<bool>* m_daemon_lost;
  bool m_sibling;
  std::vector<std::pair<uint32_t, MappedRegion>> m_headers;  // (domain, its segment header, read-only)
  std::vector<MappedDomain> m_domains;
  std::vector<TierFile> m_files[4];  // by Tier
  std::optional<DomainFrameData> m_frames[4];
  MappedRegion m_intents_map;
  std::string m_device_uuid;
  uint64_t m_device_chunk = 0;
  std::vector<DeviceWindow> m_device_windows;
};

}  // namespace tiermem::detail
