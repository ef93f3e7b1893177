// Peer authentication (S2): daemons prove to each other that they know the
// cluster's shared secret, by challenge and response; the secret never goes
// on the wire.
//
//   connecting daemon A                     listening daemon B
//   peer_challenge {A, nonce_a}     ->
//                                   <-      {B, nonce_b, proof_b}
//   (A checks proof_b)
//   peer_hello {NodeInfo of A, proof_a} ->  (B checks proof_a)
//                                   <-      {NodeInfo of B}
//
//   proof_b = HMAC-SHA256(secret, "tiermem peer server" | A | B | nonce_a | nonce_b)
//   proof_a = HMAC-SHA256(secret, "tiermem peer client" | A | B | nonce_a | nonce_b)
//
// Both nonces are fresh random bytes, so a recorded exchange is worth
// nothing; both sides are proven (a daemon never talks to an impostor that
// answers on a peer's address). Nothing but these two requests is served on
// a connection before it is authenticated.
//
// The hellos also carry each node's fabric (NodeInfo.fabric): B refuses A's
// hello, and A B's answer, when they differ (same_fabric()), so a node on
// another fabric never joins, whichever side is older.
#pragma once

#include <string>
#include <string_view>

#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

inline constexpr size_t k_nonce_bytes = 32;

class ClusterSecret {
 public:
  ClusterSecret() = default;
  // Reads the secret file, named by cluster.secret_file of configuration
  // `source`. Errors: config_error naming both when it is missing,
  // unreadable, not a regular file, shorter than 16 bytes, or readable by
  // group or others (says the mode and what to do).
  static Result<ClusterSecret> load(const std::string& path, std::string_view source);
  static ClusterSecret from_bytes(std::string bytes) {
    ClusterSecret s;
    s.m_key = std::move(bytes);
    return s;
  }
  bool empty() const { return m_key.empty(); }

  // `role` is "server" or "client"; `a` connects to `b`.
  std::string proof(std::string_view role, NodeId a, NodeId b, std::string_view nonce_a,
                    std::string_view nonce_b) const;
  // Constant-time comparison with the expected proof.
  bool verify(std::string_view proof, std::string_view role, NodeId a, NodeId b, std::string_view nonce_a,
              std::string_view nonce_b) const;

 private:
  std::string m_key;
};

// k_nonce_bytes of kernel randomness.
std::string make_nonce();

// Whether node `node`, whose data plane runs over `theirs`, may be a peer of
// this node, which runs over `ours` (NodeInfo.fabric each; empty is "ucx", a
// node from before libfabric): config_error, in the words of this node,
// when they differ.
Status same_fabric(NodeId node, std::string_view theirs, std::string_view ours);

}  // namespace tiermem
