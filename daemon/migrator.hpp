// Migration (M7): moves the pages of an allocation to another tier and/or node
// while clients read and write it.
//
// Per page: take a frame at the destination, lock the page's version word
// (writers finish first, new ones wait), copy the page, point the page entry
// at the new frame and release the word into a new epoch (every cached
// translation is stale from that moment), then free the old frame. A write
// acknowledged before the lock is in the copy; one that starts after it waits
// and then, with its stale translation refused, goes to the new frame. A read
// that overlaps the move fails validation and retries.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include <tiermem/types.h>

#include "daemon/peer_manager.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

struct MigrationResult {
  AllocationInfo allocation;
  uint64_t pages_moved = 0;
};

class Migrator {
 public:
  // `limits`: the quotas of the allocation's tenant (frames at the
  // destination count against them).
  Migrator(AddressSpace& space, PeerManager* peers, Transport* transport, std::chrono::milliseconds timeout,
           TenantLimits limits)
      : m_space(space), m_peers(peers), m_transport(transport), m_timeout(timeout), m_limits(limits) {}

  // Moves the allocation holding `gva` (homed here) to `tier` on `to_node`
  // (0: this node). Blocks; run it off the control threads. Errors:
  // invalid_argument (tier auto), bad_gva (unknown node), and those of
  // AddressSpace::begin_migration, frame reservation and the copies.
  Result<MigrationResult> migrate(Gva gva, Tier tier, NodeId to_node);

 private:
  // A frame at the destination, and the memory generation and incarnation
  // of the node that holds it.
  struct Reserved {
    Extent frame;
    uint64_t memory_generation = 0;
    uint64_t incarnation = 0;
  };
  Result<Reserved> reserve(NodeId node, Tier tier);
  void give_back(const Extent& frame);
  void release_remote(const std::vector<Extent>& frames);
  Status move_page(uint64_t page, Tier tier, NodeId to_node, std::vector<Extent>* remote_frames, bool* moved);

  AddressSpace& m_space;
  PeerManager* m_peers;
  Transport* m_transport;
  std::chrono::milliseconds m_timeout;
  TenantLimits m_limits;
  std::string m_tenant;  // of the allocation being moved
  std::vector<std::byte> m_buffer;  // a page on its way between nodes
};

}  // namespace tiermem
