// What the daemon's policies keep of an allocation: its copies (replication,
// H2) and the default class of calls on it (QoS, H3).
//
// The address space keeps it with the allocation and writes it in the same
// durable record, in the same transaction (an allocation is never recovered
// without its policy, nor a policy without its allocation); it reads one fact
// of it, whether the allocation is a copy (a copy does not hold its name: its
// home's allocation does). The daemon's ReplicaService decides and changes
// the rest (daemon/replica_service.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

namespace tiermem {

struct AllocationPolicy {
  uint32_t replicas_wanted = 0;       // copies its home places
  std::vector<ReplicaInfo> replicas;  // where they are (at most k_max_replicas)
  Gva replica_of;                     // of a copy: the allocation it copies (node 0: not a copy)
  bool replica_ready = false;         // of a copy: filled (it may serve reads)
  QosClass qos = QosClass::standard;  // the default class of calls on it
  bool demotable = false;             // cold pages may move down the tiers (M7, daemon/demoter.hpp)

  bool is_copy() const { return replica_of.node != 0; }
  // Whether writes must reach copies (it has some, or will).
  bool has_copies() const { return replicas_wanted > 0 || !replicas.empty(); }
};

}  // namespace tiermem
