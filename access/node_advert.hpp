// How a node describes its memory to whoever reaches it one-sided: plain
// structs, which the access layer takes (proto/convert.cpp makes them of a
// NodeInfo message: access/ knows nothing of the wire format).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

namespace tiermem {

// A region as a node advertises it (NodeInfo.regions on the wire): the
// version words of one domain, or the frames of one domain of a tier.
struct RegionAdvert {
  bool versions = false;  // the version words of a domain; else a tier's frames
  Tier tier = Tier::automatic;
  uint32_t domain = 0;
  uint64_t first = 0;     // the first page (versions) or frame offset (tier) it holds
  uint64_t base = 0;      // its address at the node
  uint64_t length = 0;    // bytes
  std::string packed_key;
  bool persistent = false;
  uint64_t memory_generation = 0;  // of its domain's memory: new when it was made anew
};

// How a node describes itself to whoever reaches it one-sided.
struct NodeAdvert {
  NodeId node = 0;
  uint64_t incarnation = 0;        // of the daemon: a restart makes a new one
  uint64_t pages_per_domain = 0;
  std::string transport_address;
  uint64_t regions_version = 0;  // goes up when the node registers a domain's regions
  std::vector<RegionAdvert> regions;
};

}  // namespace tiermem
