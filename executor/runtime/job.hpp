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

  std::string name(int rank, const std::string& what) const;

  // This rank's allocation `what`: found again by name, or created (zeroed)
  // on the local node. Errors: those of lookup, alloc and map; already_exists
  // with a different size (another job of the same name).
  Result<OwnRegion> own(const std::string& what, uint64_t size, AllocOptions options);

  // The GVA of rank `rank`'s allocation `what`, waiting (until the timeout)
  // for the rank to create it. Errors: timeout naming the rank.
  Result<Gva> peer(int rank, const std::string& what);

  // Control words (8 bytes at a GVA of a coherent allocation).
  // Raises the word to at least `value` (compare-and-swap loop): idempotent,
  // so a restarted rank can repeat what it did before it died.
  Status raise(Gva word, uint64_t value);
  // A copy from or to a peer's memory; while the node holding it is down
  // (its daemon restarting) it is tried again, up to the job's timeout.
  Status read(Gva at, void* dst, size_t length);
  Status write(Gva at, const void* src, size_t length);
  // Runs `op` again while it fails because the node it reaches is down,
  // until the job's timeout.
  Status while_down(const std::function<Status()>& op);
  Result<uint64_t> load(Gva word);
  // Waits until the word is at least `value`. `what` says what is awaited.
  Status wait_at_least(Gva word, uint64_t value, const std::string& what);

  Client& client() { return m_client; }
  std::chrono::milliseconds timeout() const { return m_timeout; }

 private:
  Client& m_client;
  std::string m_job;
  int m_rank;
  std::chrono::milliseconds m_timeout;
  std::map<std::string, Gva> m_found;
};

// Waits (spinning, then yielding, then sleeping) until `word` in local memory
// is at least `value`. Errors: timeout.
Status wait_local(const uint64_t* word, uint64_t value, std::chrono::milliseconds timeout, const std::string& what);
inline uint64_t load_local(const uint64_t* word) {
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(word)).load(std::memory_order_acquire);
}

}  // namespace tiermem::exec
