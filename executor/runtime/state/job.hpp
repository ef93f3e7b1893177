// A training job's memory in tiermem (X5, X10): every rank's allocations are
// named "<job>.r<rank>.<what>" on the rank's own node, so a restarted rank
// finds its parameters, optimizer state and committed step again, and peers
// find each other's mailboxes and control words by name.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <tiermem/client.h>

namespace tiermem::exec {

// An allocation of this rank, mapped into the process.
struct OwnRegion {
  Gva gva;
  Mapping mapping;
  bool existed = false;  // found again (a restart), not created
  std::byte* data() const { return mapping.data(); }
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(mapping.data()); }
};

class JobDirectory {
 public:
  JobDirectory(Client& client, std::string job, int rank, std::chrono::milliseconds timeout)
      : m_client(client), m_job(std::move(job)), m_rank(rank), m_timeout(timeout) {}

  // "<job>.r<rank>.<what>", and in generation g > 0 of the plan (runtime
  // repartitioning: replan.hpp) "<job>.r<rank>.g<g>.<what>", except for the
  // allocations every generation shares (the profile).
  std::string name(int rank, const std::string& what) const;
  void set_generation(uint64_t generation) { m_generation = generation; }
  uint64_t generation() const { return m_generation; }
  // The generation an allocation of this job's rank `rank` named `name` is
  // of (0 for one without a "g<N>." part); -1 for a name that is not one of
  // this rank's, or one all generations share.
  int64_t generation_of(int rank, const std::string& name) const;

  // This rank's allocation `what`: found again by name, or created (zeroed)
  // on the local node, and mapped unless `map` is false (a replicated one
  // cannot be). Errors: those of lookup, alloc and map; already_exists with a
  // different size (another job of the same name).
  Result<OwnRegion> own(const std::string& what, uint64_t size, AllocOptions options, bool map = true);

  // Every allocation named as this rank's `what` that other nodes hold or
  // hold a copy of (the GVA of its home, which may be gone: reads of it are
  // served by a copy), other than `mine`. Only the nodes reachable now.
  std::vector<Gva> elsewhere(const std::string& what, Gva mine);

  // The GVA of rank `rank`'s allocation `what`, waiting (until the timeout)
  // for the rank to create it. Errors: timeout naming the rank.
  Result<Gva> peer(int rank, const std::string& what);

  // Control words (8 bytes at a GVA of a coherent allocation).
  // Raises the word to at least `value` (compare-and-swap loop): idempotent,
  // so a restarted rank can repeat what it did before it died.
  Status raise(Gva word, uint64_t value);
  // A copy from or to a peer's memory; while the node holding it is down
  // (its daemon restarting) it is tried again, up to the job's timeout, and
  // when the peer's rank was replaced on another node (--replicas) the
  // access follows it to its new allocation of the same name.
  Status read(Gva at, void* dst, size_t length);
  Status write(Gva at, const void* src, size_t length);
  Result<uint64_t> load(Gva word);
  // Waits until the word is at least `value`. `what` says what is awaited.
  Status wait_at_least(Gva word, uint64_t value, const std::string& what);

  Client& client() { return m_client; }
  std::chrono::milliseconds timeout() const { return m_timeout; }
  // How many times a peer's allocation was followed to a new one so far: a
  // reader that saw it change re-checks the peer's control words (the new
  // allocation may not hold the restored state yet).
  uint64_t moves() const { return m_moves; }

 private:
  // A peer's allocation that moved: a replacement rank on another node made
  // it anew (--replicas). `at` as it is now.
  Gva current(Gva at) const;
  // `at` failed with `s`: if it is a peer's allocation whose name now
  // names another one (its rank was replaced), follows it and returns true.
  bool follow(Gva at, const Status& s);
  // Looks `name` up again; when it names another allocation than `gva`
  // now, records the move (`why`: the error that made us look) and sets
  // `gva` to it.
  bool move_to_fresh(const std::string& name, Gva& gva, const Status& why);
  // Runs `op` on `at` (as it is now) again while its node is down, and
  // after following it when it moved, until the job's timeout.
  Status on_peer(Gva at, const std::function<Status(Gva)>& op);
  // A single pass over the reachable nodes for the allocation `name`.
  Result<Gva> find(const std::string& name);

  Client& m_client;
  std::string m_job;
  int m_rank;
  std::chrono::milliseconds m_timeout;
  std::map<std::string, Gva> m_found;
  // (node, generation) of a peer allocation that moved -> (its old base,
  // where it is now).
  std::map<std::pair<NodeId, uint32_t>, std::pair<Gva, Gva>> m_moved;
  std::chrono::steady_clock::time_point m_last_follow{};
  uint64_t m_moves = 0;
  uint64_t m_generation = 0;
};

// Waits (spinning, then yielding, then sleeping) until `word` in local memory
// is at least `value`. Errors: timeout.
Status wait_local(const uint64_t* word, uint64_t value, std::chrono::milliseconds timeout, const std::string& what);
inline uint64_t load_local(const uint64_t* word) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

}  // namespace tiermem::exec
