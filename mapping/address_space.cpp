// AddressSpace: creation, allocation, free, lent frames, migration steps and
// reporting. Translation and data access are in address_space_access.cpp.
#include "mapping/address_space.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>
#include <random>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "mapping/placement.hpp"
#include "mapping/version.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_min_virtual_pages = 4096;
constexpr uint64_t k_virtual_factor = 16;

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint32_t random_generation() {
  std::random_device rd;
  uint32_t g = 0;
  while (g == 0) g = rd();
  return g;
}

}  // namespace

Result<std::unique_ptr<AddressSpace>> AddressSpace::create(const AddressSpaceOptions& options,
                                                           TierSet tiers) {
  if (!std::has_single_bit(options.page_size) || options.page_size < 4096) {
    return Status(ErrorCode::invalid_argument,
                  "page size " + std::to_string(options.page_size) +
                      " must be a power of two of at least 4096 bytes");
  }
  uint64_t frames = 0;
  for (const auto& t : tiers) {
    if (!t) continue;
    if (t->capacity() < options.page_size) {
      return Status(ErrorCode::invalid_argument,
                    std::string(tier_name(t->tier())) + " tier of " + format_size(t->capacity()) +
                        " is smaller than one page (" + format_size(options.page_size) + ")");
    }
    frames += t->capacity() / options.page_size;
  }
  uint64_t virtual_pages = options.virtual_pages;
  if (virtual_pages == 0) virtual_pages = std::max(k_min_virtual_pages, frames * k_virtual_factor);
  TIERMEM_ASSIGN_OR_RETURN(auto versions,
                           VersionArray::create(virtual_pages, "tiermem-versions", options.shared_memory));
  TIERMEM_ASSIGN_OR_RETURN(auto l3, WordArray::create(virtual_pages * k_l3_words_per_page, "tiermem-l3"));
  return std::unique_ptr<AddressSpace>(new AddressSpace(
      options, virtual_pages, std::move(tiers), std::move(versions), std::move(l3)));
}

AddressSpace::AddressSpace(const AddressSpaceOptions& options, uint64_t virtual_pages,
                           TierSet tiers, VersionArray versions, WordArray l3)
    : m_node(options.node),
      m_versions(std::move(versions)),
      m_l3(std::move(l3)),
      m_table(virtual_pages, options.page_size, m_l3.words()),
      m_virtual(1, virtual_pages - 1),  // page 0 stays unallocated: GVA offset 0 is null
      m_next_generation(options.first_generation != 0 ? options.first_generation : random_generation()),
      m_local_words(m_versions.words().data(), m_versions.size(), m_l3.words().data(), options.page_size) {
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (!tiers[i]) continue;
    TierState& t = m_tiers[i];
    t.frames = tiers[i]->capacity() / options.page_size;
    t.free_frames = ExtentSet(0, t.frames);
    t.backend = std::move(tiers[i]);
    m_local_frames[i].emplace(*t.backend);
  }
}

bool AddressSpace::take_frames(TierState& tier, uint64_t pages, std::vector<UnitRange>* frames) {
  if (!tier.backend || tier.free_frames.free_units() < pages) return false;
  return tier.free_frames.take_scattered(pages, frames);
}

Status AddressSpace::exhausted_error(const AllocRequest& request, uint64_t pages,
                                     const std::vector<Tier>& chain) const {
  std::string msg = "cannot allocate " + format_size(request.size) + " (" +
                    std::to_string(pages) + (pages == 1 ? " page" : " pages") + " of " +
                    format_size(page_size()) + ") on node " + std::to_string(m_node) + ":";
  bool any_present = false;
  for (size_t i = 0; i < chain.size(); ++i) {
    const TierState& t = m_tiers[static_cast<size_t>(chain[i])];
    msg += i == 0 ? " " : ", ";
    msg += tier_name(chain[i]);
    if (!t.backend) {
      msg += " not configured";
    } else {
      any_present = true;
      msg += " has " + std::to_string(t.free_frames.free_units()) + " of " +
             std::to_string(t.frames) + " pages free";
    }
  }
  if (request.strict && request.tier != Tier::automatic) {
    msg += "; strict placement forbids falling back to a slower tier";
  }
  if (!any_present) {
    return Status(ErrorCode::tier_unavailable, msg + " (enable the tier in tiermemd.toml)");
  }
  return Status(ErrorCode::tier_exhausted, msg + " (free memory or allow fallback)");
}

Result<AllocationInfo> AddressSpace::allocate(const AllocRequest& request) {
  if (request.size == 0) return Status(ErrorCode::invalid_argument, "cannot allocate 0 bytes");
  const uint64_t psize = page_size();
  if (request.size > (uint64_t{1} << 62)) {
    return Status(ErrorCode::invalid_argument, "size " + std::to_string(request.size) + " is absurdly large");
  }
  const uint64_t pages = (request.size + psize - 1) / psize;

  std::unique_lock lock(m_mutex);
  if (!request.name.empty() && m_names.count(request.name) != 0) {
    const Allocation& other = m_allocations.at(m_names.at(request.name));
    return Status(ErrorCode::already_exists,
                  "name '" + request.name + "' is already used by " + info_of(other).gva.to_string());
  }
  const std::vector<Tier> chain = placement_chain(request.tier, request.strict);
  Tier chosen = Tier::automatic;
  std::vector<UnitRange> frames;
  for (Tier t : chain) {
    if (take_frames(m_tiers[static_cast<size_t>(t)], pages, &frames)) {
      chosen = t;
      break;
    }
  }
  if (chosen == Tier::automatic) return exhausted_error(request, pages, chain);
  TierState& tier = m_tiers[static_cast<size_t>(chosen)];

  UnitRange virt;
  if (!m_virtual.take_next_fit(pages, m_virtual_cursor, &virt)) {
    for (const UnitRange& f : frames) tier.free_frames.release(f);
    return Status(ErrorCode::tier_exhausted,
                  "node " + std::to_string(m_node) + " has no free virtual range of " +
                      std::to_string(pages) + " pages (" + std::to_string(m_virtual.free_units()) +
                      " free in " + std::to_string(m_virtual.fragments()) + " pieces)");
  }
  m_virtual_cursor = virt.start + virt.count;

  // New memory reads as zeros: nothing of a freed allocation may show through.
  for (const UnitRange& f : frames) {
    Status s = tier.backend->discard(f.start * psize, f.count * psize);
    if (!s.ok()) {
      for (const UnitRange& r : frames) tier.free_frames.release(r);
      m_virtual.release(virt);
      return s.with_context("clearing frames for a new allocation");
    }
  }

  Allocation a;
  a.first_page = virt.start;
  a.pages = pages;
  a.size = request.size;
  a.generation = m_next_generation++;
  if (m_next_generation == 0) m_next_generation = 1;  // 0 means "unchecked"
  a.tier = chosen;
  a.name = request.name;
  a.created_unix_ms = now_unix_ms();
  a.owner_uid = request.owner_uid;
  a.coherent = request.coherent;

  uint8_t flags = k_page_read | k_page_write | k_entry_present;
  if (tier.backend->persistent()) flags |= k_page_durable;
  if (a.coherent) flags |= k_page_coherent;
  uint64_t page = a.first_page;
  for (const UnitRange& f : frames) {
    for (uint64_t i = 0; i < f.count; ++i, ++page) {
      PageEntry e;
      e.frame_offset = (f.start + i) * psize;
      e.generation = a.generation;
      e.node = m_node;
      e.tier = chosen;
      e.flags = flags;
      uint64_t& word = m_versions.word(page);
      const uint64_t locked = version::lock(word);
      m_table.set(page, e);
      version::unlock_new_epoch(word, locked);
    }
  }
  ++tier.allocations;
  if (!a.name.empty()) m_names.emplace(a.name, a.first_page);
  const AllocationInfo info = info_of(a);
  m_allocations.emplace(a.first_page, std::move(a));
  return info;
}

void AddressSpace::release_local_frame(Tier tier, uint64_t frame_offset) {
  TierState& t = m_tiers[static_cast<size_t>(tier)];
  // A failed discard only delays returning storage: frames are cleared again
  // when they are next allocated.
  (void)t.backend->discard(frame_offset, page_size());
  t.free_frames.release({frame_offset / page_size(), 1});
}

Status AddressSpace::free(Gva gva, std::vector<Extent>* remote_frames) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate(gva));
  Allocation& a = *located;
  const AllocationInfo info = info_of(a);
  if (gva.offset != info.gva.offset) {
    return Status(ErrorCode::invalid_argument,
                  gva.to_string() + " is " + std::to_string(gva.offset - info.gva.offset) +
                      " bytes into allocation " + info.gva.to_string() +
                      "; free takes the allocation's first address");
  }
  if (a.map_count > 0) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + info.gva.to_string() + " is mapped by " +
                      std::to_string(a.map_count) + " client(s); unmap it before freeing");
  }
  if (a.migrating) {
    return Status(ErrorCode::busy, "allocation " + info.gva.to_string() + " is being migrated; free it after");
  }
  // Lock every page first so no reader or writer is inside; then the new epoch
  // tells every cached translation that the page is gone.
  std::vector<uint64_t> locked(a.pages);
  for (uint64_t i = 0; i < a.pages; ++i) {
    if (!version::lock_exclusive_for(m_versions.word(a.first_page + i), k_page_lock_timeout, &locked[i])) {
      for (uint64_t j = 0; j < i; ++j) version::unlock_exclusive(m_versions.word(a.first_page + j), locked[j]);
      return Status(ErrorCode::busy, "page " + std::to_string(a.first_page + i) + " of " +
                                         info.gva.to_string() +
                                         " stayed locked by a writer; try again");
    }
  }
  for (uint64_t i = 0; i < a.pages; ++i) {
    const uint64_t page = a.first_page + i;
    const PageEntry e = *m_table.find(page);
    if (e.node == m_node) {
      release_local_frame(e.tier, e.frame_offset);
    } else if (remote_frames != nullptr) {
      remote_frames->push_back({e.tier, e.node, e.frame_offset, 0, page_size()});
    }
    m_table.clear(page);
    version::unlock_new_epoch(m_versions.word(page), locked[i]);
  }
  m_virtual.release({a.first_page, a.pages});
  --m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty()) m_names.erase(a.name);
  m_allocations.erase(a.first_page);
  return Status();
}

Result<AllocationInfo> AddressSpace::lookup(std::string_view name) const {
  std::shared_lock lock(m_mutex);
  auto it = m_names.find(std::string(name));
  if (it == m_names.end()) {
    return Status(ErrorCode::not_found, "no allocation is named '" + std::string(name) +
                                            "' on node " + std::to_string(m_node));
  }
  return info_of(m_allocations.at(it->second));
}

AllocationInfo AddressSpace::info_of(const Allocation& a) const {
  AllocationInfo info;
  info.gva.node = m_node;
  info.gva.generation = a.generation;
  info.gva.offset = a.first_page * page_size();
  info.size = a.size;
  const PageEntry* first = m_table.find(a.first_page);
  info.tier = first != nullptr && first->present() ? first->tier : a.tier;
  info.name = a.name;
  info.pages = a.pages;
  info.map_count = a.map_count;
  info.created_unix_ms = a.created_unix_ms;
  info.owner_uid = a.owner_uid;
  return info;
}

// --- frames lent to other nodes ---------------------------------------------

Result<std::vector<Extent>> AddressSpace::reserve_frames(Tier tier, uint64_t pages, bool lend) {
  std::unique_lock lock(m_mutex);
  TierState& t = m_tiers[static_cast<size_t>(tier)];
  if (!t.backend) {
    return Status(ErrorCode::tier_unavailable, "node " + std::to_string(m_node) + " has no " +
                                                   std::string(tier_name(tier)) + " tier");
  }
  std::vector<UnitRange> frames;
  if (!take_frames(t, pages, &frames)) {
    return Status(ErrorCode::tier_exhausted, "node " + std::to_string(m_node) + " " +
                                                 std::string(tier_name(tier)) + " has " +
                                                 std::to_string(t.free_frames.free_units()) +
                                                 " free pages, " + std::to_string(pages) + " needed");
  }
  std::vector<Extent> out;
  for (const UnitRange& f : frames) {
    (void)t.backend->discard(f.start * page_size(), f.count * page_size());
    out.push_back({tier, m_node, f.start * page_size(), 0, f.count * page_size()});
  }
  if (lend) t.lent_frames += pages;
  return out;
}

void AddressSpace::return_frames(const std::vector<Extent>& frames) {
  std::unique_lock lock(m_mutex);
  for (const Extent& x : frames) {
    m_tiers[static_cast<size_t>(x.tier)].free_frames.release({x.frame_offset / page_size(), x.length / page_size()});
  }
}

Status AddressSpace::release_frames(const std::vector<Extent>& frames) {
  std::unique_lock lock(m_mutex);
  for (const Extent& x : frames) {
    TierState& t = m_tiers[static_cast<size_t>(x.tier)];
    const uint64_t count = x.length / page_size();
    if (!t.backend || x.node != m_node || x.frame_offset % page_size() != 0 || count > t.lent_frames) {
      return Status(ErrorCode::invalid_argument, "frames at " + std::to_string(x.frame_offset) + " of " +
                                                     std::string(tier_name(x.tier)) + " were not lent by node " +
                                                     std::to_string(m_node));
    }
    (void)t.backend->discard(x.frame_offset, x.length);
    t.free_frames.release({x.frame_offset / page_size(), count});
    t.lent_frames -= count;
  }
  return Status();
}

// --- migration ------------------------------------------------------------------

Result<std::vector<uint64_t>> AddressSpace::begin_migration(Gva gva) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate(gva));
  Allocation& a = *located;
  const std::string name = info_of(a).gva.to_string();
  if (a.map_count > 0) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + name + " is mapped by a client (pinned); unmap it to migrate");
  }
  if (a.coherent) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + name + " is coherent: its atomic words stay where clients address them");
  }
  if (a.migrating) return Status(ErrorCode::busy, "allocation " + name + " is already being migrated");
  a.migrating = true;
  std::vector<uint64_t> pages(a.pages);
  for (uint64_t i = 0; i < a.pages; ++i) pages[i] = a.first_page + i;
  return pages;
}

void AddressSpace::end_migration(Gva gva) {
  std::unique_lock lock(m_mutex);
  auto located = locate(gva);
  if (located.ok()) (*located)->migrating = false;
}

Result<PageMove> AddressSpace::begin_move(uint64_t page, std::chrono::milliseconds timeout) {
  PageMove move;
  move.page = page;
  {
    std::shared_lock lock(m_mutex);
    const PageEntry* e = m_table.find(page);
    if (e == nullptr || !e->present()) return Status(ErrorCode::not_allocated, "page was freed");
  }
  if (!version::lock_exclusive_for(m_versions.word(page), timeout, &move.locked)) {
    const uint64_t v = version::load(m_versions.word(page));
    return Status(ErrorCode::busy, "page " + std::to_string(page) + " stayed locked by a writer (version " +
                                       std::to_string(version::epoch_of(v)) + "." +
                                       std::to_string(version::sequence_of(v)) + ")");
  }
  std::shared_lock lock(m_mutex);
  move.from = *m_table.find(page);
  return move;
}

Status AddressSpace::commit_move(const PageMove& move, const PageEntry& to,
                                 std::vector<Extent>* remote_frames) {
  std::unique_lock lock(m_mutex);
  PageEntry entry = to;
  entry.generation = move.from.generation;
  entry.flags = static_cast<uint8_t>((move.from.flags & ~k_page_durable) | k_entry_present);
  if (to.tier == Tier::pmem) entry.flags |= k_page_durable;
  m_table.set(move.page, entry);
  m_table.clean(move.page);
  version::unlock_new_epoch(m_versions.word(move.page), move.locked);
  if (move.from.node == m_node) {
    release_local_frame(move.from.tier, move.from.frame_offset);
  } else if (remote_frames != nullptr) {
    remote_frames->push_back({move.from.tier, move.from.node, move.from.frame_offset, 0, page_size()});
  }
  return Status();
}

void AddressSpace::abort_move(const PageMove& move) {
  version::unlock_exclusive(m_versions.word(move.page), move.locked);
}

// --- reporting ------------------------------------------------------------------

std::vector<TierStat> AddressSpace::tier_stats() const {
  std::shared_lock lock(m_mutex);
  std::vector<TierStat> out;
  for (Tier t : k_tiers_fastest_first) {
    const TierState& s = m_tiers[static_cast<size_t>(t)];
    if (!s.backend) continue;
    TierStat stat;
    stat.tier = t;
    stat.capacity_bytes = s.frames * page_size();
    stat.free_bytes = s.free_frames.free_units() * page_size();
    stat.used_bytes = stat.capacity_bytes - stat.free_bytes;
    stat.persistent = s.backend->persistent();
    stat.shareable = s.backend->share_fd() >= 0 || !s.backend->ipc_handle().empty();
    stat.backing = s.backend->backing();
    stat.allocations = s.allocations;
    out.push_back(std::move(stat));
  }
  return out;
}

size_t AddressSpace::allocation_count() const {
  std::shared_lock lock(m_mutex);
  return m_allocations.size();
}

std::vector<AllocationInfo> AddressSpace::list() const {
  std::shared_lock lock(m_mutex);
  std::vector<AllocationInfo> out;
  out.reserve(m_allocations.size());
  for (const auto& [page, a] : m_allocations) out.push_back(info_of(a));
  return out;
}

MappingDump AddressSpace::dump() const {
  std::shared_lock lock(m_mutex);
  MappingDump d;
  d.node = m_node;
  d.page_size = page_size();
  d.l2_pages = k_l2_pages;
  for (const auto& [first, a] : m_allocations) {
    d.allocations.push_back(info_of(a));
    for (uint64_t p = first; p < first + a.pages; ++p) d.pages.push_back(page_info(p));
  }
  return d;
}

}  // namespace tiermem
