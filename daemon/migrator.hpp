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
//
// Pages move in runs of up to 32 pages (64 MiB within a node, 4 MiB when a
// page crosses nodes): the run's frames are reserved in one go, its pages
// locked in ascending order (a writer never waits while it holds a page, so
// the two never wait on each other in a cycle), copied as one batch (the
// copy engines take every range of a run before the one wait, contiguous
// frames as one copy) and committed with one durable record: all of the run
// moves or none of it. Per-page bookkeeping cost as much as a 2 MiB page's
// copy; a run of 32 pays it once. Writers and readers of a run's pages wait
// or retry for the run's copy (about a millisecond on a GPU, some 8 ms over
// TCP) instead of one page's.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
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
  // Moves `pages` (page numbers of the allocation whose first byte is
  // `base`, homed here; others are ignored) to `tier` of this node, in runs
  // as migrate() does; the allocation's other pages stay where they are.
  // Demotion's move (daemon/demoter.hpp). Returns the pages moved; errors as
  // migrate(), with the pages moved before the failure in the message.
  Result<uint64_t> move_pages(Gva base, std::vector<uint64_t> pages, Tier tier);

 private:
  // Frames at the destination (one page each), and the memory generation
  // and incarnation of the node that holds them.
  struct Reserved {
    std::vector<Extent> frames;
    uint64_t memory_generation = 0;
    uint64_t incarnation = 0;
  };
  Result<Reserved> reserve(NodeId node, Tier tier, uint64_t pages);
  void give_back(std::span<const Extent> frames);
  void release_remote(const std::vector<Extent>& frames);
  // Moves the pages of `run` (ascending, of the allocation being moved);
  // *moved: how many changed place (pages already at the destination stay).
  Status move_run(std::span<const uint64_t> run, Tier tier, NodeId to_node, std::vector<Extent>* remote_frames,
                  uint64_t* moved);
  // Copies every locked page of `moves` into targets[i].
  Status copy_run(std::span<const PageMove> moves, std::span<const Extent> targets, Tier tier, NodeId to_node,
                  uint64_t incarnation);

  AddressSpace& m_space;
  PeerManager* m_peers;
  Transport* m_transport;
  std::chrono::milliseconds m_timeout;
  TenantLimits m_limits;
  std::string m_tenant;  // of the allocation being moved
  std::vector<std::byte> m_buffer;  // a page on its way between nodes
};

}  // namespace tiermem
