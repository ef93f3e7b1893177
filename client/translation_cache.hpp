// The translations a client caches (M1's "translation cache"): by the node
// and start of each allocation, valid while every page's epoch in the home
// node's version words still equals the one recorded (the caller checks,
// and translates again when one moved on). Thread-safe: lookups share a
// lock, changes take it alone; entries are immutable and shared, so a
// reader keeps the one it found while another thread replaces it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <utility>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/types.h>

namespace tiermem::detail {

struct Routes;  // client_core.hpp: the paths to the pieces, decided once

// A translation cached by the client.
struct CachedAllocation {
  Gva base;  // carries the generation
  uint64_t size = 0;
  uint32_t slot_bytes = 0;  // a sub-page allocation's size class
  uint64_t first_page = 0;
  bool coherent = false;
  // How it is reached beyond its pieces' routes, decided once per
  // translation: its writes and atomics go through its home daemon (which
  // writes the copies of replicated memory first, and refuses writes to a
  // copy but its home's); a read its home cannot serve may be read from a
  // copy.
  bool changes_through_home = false;
  bool readable_copies = false;
  QosClass qos = QosClass::standard;  // the default class of calls on it
  uint64_t home_incarnation = 0;  // of the daemon that translated
  std::vector<Extent> extents;
  std::vector<uint64_t> page_versions;
  std::shared_ptr<const Routes> routes;  // null until a copy decided them
};

class TranslationCache {
 public:
  explicit TranslationCache(uint64_t page_size) : m_page_size(page_size) {}

  // The translation holding `gva` (of its generation, when the GVA carries
  // one), or null. A sub-page allocation holds its bytes only (its
  // neighbours are other allocations); any other, its pages.
  std::shared_ptr<const CachedAllocation> find(Gva gva) const;
  // Keeps `a` (replacing what was kept for its allocation).
  void put(std::shared_ptr<const CachedAllocation> a);
  // Keeps `with` instead of `old`, unless `old` was replaced meanwhile.
  void replace(const std::shared_ptr<const CachedAllocation>& old, std::shared_ptr<const CachedAllocation> with);
  // Drops the translation of the allocation holding `gva`, or of every
  // allocation of `node`.
  void forget(Gva gva);
  void forget_node(NodeId node);

 private:
  using Key = std::pair<NodeId, uint64_t>;  // node, start
  uint64_t m_page_size;
  mutable std::shared_mutex m_mutex;
  std::map<Key, std::shared_ptr<const CachedAllocation>> m_entries;
};

}  // namespace tiermem::detail
