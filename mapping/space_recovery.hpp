// Rebuilds a new AddressSpace from its durable metadata's image (H5), once,
// at a daemon's start: domains first (their files opened with the limits
// they had), then each allocation (its virtual range and local frames taken
// back, its page entries set), then the frames lent to other nodes.
//
// What the records point at is checked against the tiers: a record that does
// not fit (a range taken twice, a frame outside its domain) is dropped, erased
// from the pool and reported; pages whose memory did not survive are flagged
// lost, so reads of their allocation fail with data_lost and say why, never
// silently. What survived is judged per domain (one tenant's files): DRAM
// when the domain's shared memory was taken over and its DRAM file is whole,
// PMEM when its PMEM file is whole, VRAM never. A tenant that damaged its own
// files loses its own memory and no one else's.
//
// It holds what only a start needs (which tiers of each domain kept their
// memory, the report being written) and works on the space's internals as
// its friend, under the space's lock; the space is not visible to anyone
// until it returns.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "mapping/address_space.hpp"

namespace tiermem {

class SpaceRecovery {
 public:
  // `space` was just made on its metadata's geometry: nothing allocated yet.
  SpaceRecovery(AddressSpace& space, const MetadataImage& image) : m_space(space), m_image(image) {}

  // Rebuilds the space and returns what it found.
  RecoveryReport run();

 private:
  using Allocation = AllocationEntry;

  // Which tiers of one domain kept their memory over the restart, and what
  // to say of a lost frame of each.
  struct DomainSurvival {
    std::array<bool, 4> kept{};            // the tier's memory outlived the daemon before
    std::array<uint64_t, 4> file_bytes{};  // of its file then: frames past it are gone
    std::array<std::string, 4> why;
  };

  void recover_domains();
  void judge_domain(const DomainRecord& d);
  // Removes the files of domains no record speaks for.
  void remove_unrecorded_domains();
  void recover_allocations();
  // Recovers one allocation; false (and why) when it does not fit.
  bool recover_allocation(const AllocationRecord& r, std::string* why);
  // Its steps: the record is consistent; its range and local frames are
  // free and taken (all or none); its page entries set (lost and torn pages
  // flagged).
  bool check_record(const AllocationRecord& r, std::string* why) const;
  bool take_back(const AllocationRecord& r, std::string* why);
  void restore_pages(Allocation& a, const AllocationRecord& r);
  // One page's word after a restart; true when a dead writer's lock was broken.
  bool settle_word(uint64_t page);
  // An allocation in a slab recovered before; false (and why) when it does
  // not fit in it.
  bool recover_in_slab(const AllocationRecord& r, std::string* why);
  // Slabs left with nothing in them are given back.
  void release_empty_slabs();
  void recover_lent();
  // An allocation as its record describes it (its pages not restored).
  static Allocation from_record(const AllocationRecord& r);
  // Re-records flags found now and counts what was lost.
  void note_recovered(const Allocation& a, const AllocationRecord& r);
  // Why a recovered allocation has lost pages.
  std::string why_lost(const Allocation& a) const;
  // Whether a local frame of `domain` kept its bytes over the restart.
  bool frame_survived(uint32_t domain, Tier tier, uint64_t frame_offset) const;

  AddressSpace& m_space;
  const MetadataImage& m_image;
  RecoveryReport m_report;
  std::vector<DomainSurvival> m_survival;  // by domain
};

}  // namespace tiermem
