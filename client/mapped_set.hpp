// The Mappings a Client made that are still alive (internal). A mapping
// exposes a tier's memory raw, with no version check, so it must never
// outlive the allocation it was made of: the pin that keeps the allocation
// in place belongs to one daemon session (and, while the process lives, to
// the daemon's lease of it, daemon/leases.hpp), and a daemon that restarts
// knows nothing of it. The set is what a reconnect pins again, and what is
// revoked when it cannot be: its memory is replaced with inaccessible
// memory (the next access faults in this process instead of writing into
// whatever the frames hold now), its status records why, and the Client's
// on_mapping_revoked callback is told.
//
// Thread-safe. Revocation and Mapping::release serialise on the set's
// mutex, so a revocation never maps over an address range that was given
// back to the system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

namespace tiermem::detail {

class ClientCore;

class MappedSet {
 public:
  using OnRevoked = std::function<void(Gva, const Status&)>;
  explicit MappedSet(OnRevoked on_revoked) : m_on_revoked(std::move(on_revoked)) {}

  struct Entry {
    AllocationInfo allocation;
    std::byte* base = nullptr;  // of the reserved range (host memory; null for VRAM)
    size_t length = 0;
    std::vector<Extent> extents;  // where its bytes were when it was mapped
    Status revoked;               // ok while usable
  };

  // The connection the set's pins are on (a reconnect replaces it); Mapping
  // unmaps through it.
  std::shared_ptr<ClientCore> core() const;
  void set_core(std::shared_ptr<ClientCore> core);

  uint64_t add(Entry entry);
  // Forgets mapping `id` and gives its address range back (munmap). Returns
  // whether its allocation is still pinned for it (not revoked): the caller
  // then unmaps it at the daemon.
  bool remove(uint64_t id);
  bool contains(uint64_t id) const;
  // Ok while mapping `id` is usable, else why it was revoked.
  Status status(uint64_t id) const;
  // The mappings not revoked, by id.
  std::map<uint64_t, Entry> live() const;
  // Revokes mapping `id` (see the header comment), or every live mapping
  // `which` selects. The callback is told later, by deliver().
  void revoke(uint64_t id, const Status& why);
  void revoke_if(const std::function<bool(const Entry&)>& which, const Status& why);
  // Tells the callback of every revocation since the last call. Call it
  // with no lock of the Client held: the callback may call the Client.
  void deliver();

 private:
  void revoke_locked(Entry& e, const Status& why);

  OnRevoked m_on_revoked;
  mutable std::mutex m_mutex;
  std::shared_ptr<ClientCore> m_core;
  uint64_t m_next_id = 1;
  std::map<uint64_t, Entry> m_entries;
  std::vector<std::pair<Gva, Status>> m_pending;  // revocations the callback has not been told of
};

}  // namespace tiermem::detail
