#include "daemon/authoriser.hpp"

#include <string>

#include <tiermem/status_macros.h>

namespace tiermem {

Status Authoriser::admit(const proto::Request& request, const SessionState& session, const char* name, bool peer_only) {
  const auto body = request.body_case();
  if (!session.greeted) {
    const bool first = session.remote ? body == proto::Request::kPeerChallenge ||
                                            (body == proto::Request::kPeerHello && !session.challenge_nonce.empty())
                                      : body == proto::Request::kHello;
    if (!first) {
      return Status(ErrorCode::unexpected_message,
                    session.remote ? "a connection to the peer port must authenticate first (peer_challenge, then "
                                     "peer_hello); clients connect to the Unix socket"
                                   : "the first request on a connection must be hello");
    }
    return Status();
  }
  const bool peer_greeting = body == proto::Request::kPeerChallenge || body == proto::Request::kPeerHello;
  if (body == proto::Request::kHello || (session.remote && peer_greeting)) {
    // Who a session is was settled by its first requests: a peer that was
    // authenticated may not name itself another node by a new challenge.
    // (A peer request on the Unix socket is refused by its service: peers
    // connect over TCP.)
    return Status(ErrorCode::unexpected_message,
                  std::string(name) +
                      " on a connection that said who it is already (" +
                      (session.peer ? "peer node " + std::to_string(session.peer_node) : session.who.describe()) +
                      "): it is a connection's first request only");
  }
  if (!session.peer && request.by_home()) {
    return Status(ErrorCode::permission_denied,
                  "by_home is for the daemon that is the home of a copy, not for clients (" + session.who.describe() +
                      ")");
  }
  if (!session.peer && peer_only) {
    return Status(ErrorCode::permission_denied,
                  std::string(name) + " is for peer daemons only, not for clients (" + session.who.describe() + ")");
  }
  return Status();
}

Identity Authoriser::requester(const proto::Request& request, const SessionState& session) {
  if (!session.peer) return session.who;
  // A peer relays for one of its clients; the peer is authenticated, and
  // vouches for who that client is.
  // (A daemon's own requests, a migration's say, say it is an operator.)
  Identity who;
  who.tenant = request.tenant();
  who.is_operator = request.is_operator();
  who.uid = request.uid();
  if (request.by_home()) who.acting_home = session.peer_node;
  return who;
}

proto::Request Authoriser::relayed(const proto::Request& request, const Identity& who) {
  proto::Request relayed = request;
  relayed.set_tenant(who.tenant);
  relayed.set_is_operator(who.is_operator);
  relayed.set_uid(who.uid);
  return relayed;
}

Result<AllocationInfo> Authoriser::authorize(const Identity& who, Gva gva, const char* verb) const {
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  TIERMEM_RETURN_IF_ERROR(permit(who, gva, t.allocation, verb));
  return t.allocation;
}

Status Authoriser::permit(const Identity& who, Gva gva, const AllocationInfo& allocation, const char* verb) {
  if (who.is_operator || allocation.tenant == who.tenant) return Status();
  return Status(ErrorCode::permission_denied, who.describe() + " may not " + verb + " " + gva.to_string() +
                                                  ": allocation " + allocation.gva.to_string() +
                                                  " belongs to tenant '" + allocation.tenant + "'");
}

}  // namespace tiermem
