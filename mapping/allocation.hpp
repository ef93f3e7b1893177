// One allocation as the address space keeps it (AddressSpace's record of it
// in memory; AllocationInfo is what it tells others, AllocationRecord what
// the durable metadata keeps). Apart so that the structures that hold
// allocations (the slabs of sub-page ones, SlabSet) can name it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

#include "mapping/allocation_policy.hpp"

namespace tiermem {

struct AllocationEntry {
  uint64_t first_page = 0;
  // A sub-page allocation: where it starts in its page (first_page, a
  // slab's) and its size class; slot_bytes 0: whole pages.
  uint64_t page_offset = 0;
  uint32_t slot_bytes = 0;
  uint64_t pages = 0;
  uint64_t size = 0;
  uint32_t generation = 0;
  Tier tier = Tier::automatic;  // where it was placed
  std::string name;
  uint32_t map_count = 0;
  uint64_t created_unix_ms = 0;
  uint32_t owner_uid = 0;
  std::string tenant;
  bool coherent = false;
  bool session = false;  // not in the durable metadata
  bool migrating = false;
  uint64_t lost_pages = 0;  // on frames of a node whose memory was made anew
  uint64_t torn_pages = 0;  // flag T: a writer died holding the page's lock
  AllocationPolicy policy;  // the daemon's (allocation_policy.hpp)
};

}  // namespace tiermem
