// What the daemon knows about one connection (its control session).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/gva.h>

#include "daemon/tenants.hpp"

namespace tiermem {

// What the daemon knows about one connection.
struct SessionState {
  uint64_t id = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  std::vector<uint32_t> groups;  // supplementary groups (Unix sessions)
  std::string client_name;
  bool greeted = false;          // hello (or an authenticated peer hello) exchanged
  bool peer = false;             // an authenticated peer daemon
  bool remote = false;           // over TCP: no descriptors, no mappings
  Identity who;                  // a client's tenant (after hello)
  NodeId peer_node = 0;          // the peer's node id (after authentication)
  std::string challenge_nonce;   // ours, sent in the peer challenge
  std::string peer_nonce;        // the peer's, from its challenge
  uint64_t client_id = 0;        // the Client object of its process (hello): leases are its
  std::vector<Gva> owned;        // its session allocations, freed when it ends
};

}  // namespace tiermem
