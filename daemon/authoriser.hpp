// Who may ask what (the trust model, docs/ARCHITECTURE.md):
//   - a Unix-socket session is a client: hello first; it is its tenant (from
//     its peer credentials) and may touch that tenant's memory only, or
//     every tenant's when it is an operator; the requests daemons make of
//     each other are refused to it;
//   - a TCP session is a peer daemon: peer_challenge and peer_hello
//     (authentication) first; after that it may make peer requests and
//     relay its clients' requests, which carry their tenant;
//   - nothing is served on a session before it said who it is, and it says
//     so once.
// The checks before any work (admit), who a request is for (requester), and
// whether that one may touch an allocation (authorize, permit, checked).
#pragma once

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "control.pb.h"
#include "daemon/session_state.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

class Authoriser {
 public:
  explicit Authoriser(const AddressSpace& space) : m_space(space) {}

  // Refuses what this session may not ask at all, before any work: anything
  // before it said who it is, a second greeting, by_home from a client, and
  // (`peer_only`, the table of requests says) what daemons ask of each other.
  // `name`: the request kind's, for the message.
  static Status admit(const proto::Request& request, const SessionState& session, const char* name, bool peer_only);
  // Who asked: the session's client, or the client a peer relays for.
  static Identity requester(const proto::Request& request, const SessionState& session);
  // `request` as this daemon sends it on to a peer, acting for `who`: the
  // peer learns who that is from us alone (its requester() reads it back).
  static proto::Request relayed(const proto::Request& request, const Identity& who);
  // The allocation holding `gva`, when `who` may `verb` it. Errors: those of
  // AddressSpace::translate(); permission_denied naming both tenants.
  Result<AllocationInfo> authorize(const Identity& who, Gva gva, const char* verb) const;
  // The same check of an allocation already looked up.
  static Status permit(const Identity& who, Gva gva, const AllocationInfo& allocation, const char* verb);
  // `gva`, pinned to the generation of `allocation`, which it was authorized
  // for: what a request goes on with, so that an allocation freed and made
  // anew in between is stale, never someone else's.
  static Gva checked(Gva gva, const AllocationInfo& allocation) {
    gva.generation = allocation.gva.generation;
    return gva;
  }

 private:
  const AddressSpace& m_space;
};

}  // namespace tiermem
