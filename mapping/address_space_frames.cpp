// AddressSpace: frames (taking, giving back, lending to other nodes),
// migration steps and reporting.
#include <algorithm>
#include <mutex>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "mapping/address_space.hpp"
#include "pages/lock_intents.hpp"
#include "pages/version.hpp"

namespace tiermem {

bool AddressSpace::take_frames(Tier tier, uint32_t domain, uint64_t pages, std::vector<UnitRange>* frames) {
  TierState& t = m_tiers[static_cast<size_t>(tier)];
  Domain& d = m_domains.at(domain);
  const auto i = static_cast<size_t>(tier);
  if (!t.backend || t.used + pages > t.frames || d.used[i] + pages > d.limit[i]) return false;
  ExtentSet& free = t.backend->per_domain() ? d.free_frames[i] : t.shared_free;
  frames->clear();
  if (!free.take_scattered(pages, frames)) return false;
  t.used += pages;
  d.used[i] += pages;
  return true;
}

Status AddressSpace::prepare_frames(Tier tier, const std::vector<UnitRange>& frames, bool overwritten) {
  TierBackend& b = *m_tiers[static_cast<size_t>(tier)].backend;
  for (const UnitRange& f : frames) {
    // New memory reads as zeros (nothing of a freed allocation may show
    // through) and has its storage now.
    if (!overwritten) TIERMEM_RETURN_IF_ERROR(b.discard(f.start * page_size(), f.count * page_size()));
    Status committed = b.commit(f.start * page_size(), f.count * page_size());
    // The file system is full: perhaps a tenant grew its files past their
    // sizes since the last sweep. That growth goes first, then once more.
    if (committed.code() == ErrorCode::tier_exhausted && trim_tenant_files_locked()) {
      committed = b.commit(f.start * page_size(), f.count * page_size());
    }
    TIERMEM_RETURN_IF_ERROR(committed);
  }
  return Status();
}

void AddressSpace::release_local_frame(Tier tier, uint64_t frame_offset, uint32_t domain) {
  TierState& t = m_tiers[static_cast<size_t>(tier)];
  Domain& d = m_domains.at(domain);
  // A failed discard only delays returning storage: frames are cleared again
  // when they are next allocated.
  (void)t.backend->release(frame_offset, page_size());
  ExtentSet& free = t.backend->per_domain() ? d.free_frames[static_cast<size_t>(tier)] : t.shared_free;
  if (free.release({frame_offset / page_size(), 1})) {
    --t.used;
    --d.used[static_cast<size_t>(tier)];
  }
}

void AddressSpace::release_local_frames(Tier tier, const std::vector<UnitRange>& frames, uint32_t domain) {
  for (const UnitRange& f : frames) {
    for (uint64_t i = 0; i < f.count; ++i) release_local_frame(tier, (f.start + i) * page_size(), domain);
  }
}

// --- frames for pages moving here or homed elsewhere ----------------------------

Result<std::vector<Extent>> AddressSpace::reserve_frames(Tier tier, uint64_t pages, const std::string& tenant,
                                                         const TenantLimits& limits, NodeId borrower) {
  std::unique_lock lock(m_mutex);
  TierState& t = m_tiers[static_cast<size_t>(tier)];
  if (tier == Tier::automatic || !t.backend) {
    return Status(ErrorCode::tier_unavailable, "node " + std::to_string(m_node) + " has no " +
                                                   std::string(tier_name(tier)) + " tier");
  }
  if (pages == 0 || pages > t.frames) {
    return Status(ErrorCode::invalid_argument, "cannot reserve " + std::to_string(pages) + " pages of " +
                                                   std::string(tier_name(tier)) + " on node " + std::to_string(m_node) +
                                                   ", which has " + std::to_string(t.frames));
  }
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, assign_domain(tenant, limits));
  std::vector<UnitRange> frames;
  if (!take_frames(tier, domain, pages, &frames)) {
    const Domain& d = m_domains.at(domain);
    const auto i = static_cast<size_t>(tier);
    if (d.limit[i] < t.frames && d.used[i] + pages > d.limit[i]) {
      return Status(ErrorCode::quota_exceeded, "tenant '" + tenant + "' may use " + format_size(d.limit[i] * page_size()) +
                                                   " of " + std::string(tier_name(tier)) + " on node " +
                                                   std::to_string(m_node) + ", uses " +
                                                   format_size(d.used[i] * page_size()) + ", " +
                                                   std::to_string(pages) + " more pages asked");
    }
    return Status(ErrorCode::tier_exhausted, "node " + std::to_string(m_node) + " " + std::string(tier_name(tier)) +
                                                 " has " + std::to_string(t.frames - t.used) + " free pages, " +
                                                 std::to_string(pages) + " needed");
  }
  // Frames for pages moving here: the mover copies a whole page into each
  // before the page is published (or gives the frame back).
  if (Status s = prepare_frames(tier, frames, true); !s.ok()) {
    release_local_frames(tier, frames, domain);
    return s.with_context("frames to lend to node " + std::to_string(borrower));
  }
  if (Status s = record_lent(tier, frames, borrower, domain); !s.ok()) {
    release_local_frames(tier, frames, domain);
    return s;
  }
  std::vector<Extent> out;
  for (const UnitRange& f : frames) {
    out.push_back({tier, m_node, f.start * page_size(), 0, f.count * page_size()});
    for (uint64_t i = 0; i < f.count; ++i) {
      m_loans.lend(tier, (f.start + i) * page_size(), borrower, domain);
    }
  }
  return out;
}

void AddressSpace::return_frames(const std::vector<Extent>& frames) {
  (void)release_frames(frames, m_node);
}

Status AddressSpace::release_frames(const std::vector<Extent>& frames, NodeId borrower) {
  std::unique_lock lock(m_mutex);
  // All or nothing: every frame must be one lent to `borrower` and not given
  // back yet, and named once, or nothing is released (a frame of a live
  // allocation, or a free one, is never released on anyone's word).
  std::set<std::pair<uint8_t, uint64_t>> named;
  for (const Extent& x : frames) {
    const bool tier_ok = x.tier != Tier::automatic && static_cast<size_t>(x.tier) < m_tiers.size() &&
                         m_tiers[static_cast<size_t>(x.tier)].backend;
    bool lent = tier_ok && x.node == m_node && x.length > 0 && x.frame_offset % page_size() == 0 &&
                x.length % page_size() == 0 && x.frame_offset + x.length > x.frame_offset;
    for (uint64_t at = 0; lent && at < x.length; at += page_size()) {
      const auto loan = m_loans.find(x.tier, x.frame_offset + at);
      lent = loan && loan->borrower == borrower &&
             named.insert({static_cast<uint8_t>(x.tier), x.frame_offset + at}).second;
    }
    if (!lent) {
      return Status(ErrorCode::invalid_argument, "frames at offset " + std::to_string(x.frame_offset) + " (" +
                                                     std::to_string(x.length) + " bytes) of " +
                                                     std::string(tier_name(x.tier)) + " on node " +
                                                     std::to_string(m_node) + " are not lent to node " +
                                                     std::to_string(borrower) + " (or are named twice); nothing released");
    }
  }
  for (const Extent& x : frames) {
    const UnitRange range{x.frame_offset / page_size(), x.length / page_size()};
    if (borrower != m_node) TIERMEM_RETURN_IF_ERROR(record_lent(x.tier, {range}, 0, 0));
    for (uint64_t at = 0; at < x.length; at += page_size()) {
      const auto loan = m_loans.settle(x.tier, x.frame_offset + at);  // checked above
      release_local_frame(x.tier, x.frame_offset + at, loan->domain);
    }
  }
  return Status();
}

size_t AddressSpace::lent_to(NodeId borrower) const {
  std::shared_lock lock(m_mutex);
  return m_loans.lent_to(borrower);
}

// --- migration ------------------------------------------------------------------

Result<std::vector<uint64_t>> AddressSpace::begin_migration(Gva gva) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate_usable(gva));
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
  if (a.slot_bytes != 0) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + name + " is a sub-page allocation of " + format_size(a.size) +
                      ": it shares page " + std::to_string(a.first_page) +
                      " with other small allocations, and shared pages are not migrated (allocate more than " +
                      format_size(m_sub_page_max) + " to get pages of its own)");
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

std::vector<AddressSpace::DemotableAllocation> AddressSpace::demotable_allocations(Tier tier) const {
  std::shared_lock lock(m_mutex);
  std::vector<DemotableAllocation> out;
  for (const auto& [start, a] : m_allocations) {
    if (!a.policy.demotable || a.policy.is_copy() || a.coherent || a.slot_bytes != 0 || a.map_count > 0 ||
        a.migrating || a.lost_pages > 0) {
      continue;
    }
    DemotableAllocation d;
    d.base.node = m_node;
    d.base.generation = a.generation;
    d.base.offset = start;
    for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
      const PageEntry* e = m_table.find(p);
      if (e == nullptr || !e->present() || e->node != m_node || e->tier != tier) continue;
      d.pages.push_back({p, version::load(m_versions->word(p))});
    }
    if (d.pages.empty()) continue;
    d.tenant = a.tenant;
    out.push_back(std::move(d));
  }
  return out;
}

Result<PageEntry> AddressSpace::page_entry(uint64_t page) const {
  std::shared_lock lock(m_mutex);
  const PageEntry* e = m_table.find(page);
  if (e == nullptr || !e->present()) return Status(ErrorCode::not_allocated, "page " + std::to_string(page) + " is not allocated");
  return *e;
}

Result<PageMove> AddressSpace::begin_move(uint64_t page, std::chrono::milliseconds timeout) {
  PageMove move;
  move.page = page;
  {
    std::shared_lock lock(m_mutex);
    const PageEntry* e = m_table.find(page);
    if (e == nullptr || !e->present()) return Status(ErrorCode::not_allocated, "page was freed");
  }
  if (!version::lock_exclusive_for(m_versions->word(page), timeout, &move.locked)) {
    const uint64_t v = version::load(m_versions->word(page));
    return Status(ErrorCode::busy, "page " + std::to_string(page) + " stayed locked by a writer (version " +
                                       std::to_string(version::epoch_of(v)) + "." +
                                       std::to_string(version::sequence_of(v)) + ")");
  }
  std::shared_lock lock(m_mutex);
  move.from = *m_table.find(page);
  return move;
}

Status AddressSpace::commit_moves(std::span<const PageMove> moves, std::span<const PageEntry> to,
                                  std::vector<Extent>* remote_frames) {
  if (moves.size() != to.size()) return Status(ErrorCode::internal, "commit_moves: a destination per page");
  if (moves.empty()) return Status();
  std::unique_lock lock(m_mutex);
  const Allocation* owner = owner_of_page(moves.front().page);
  for (const PageMove& move : moves) {
    if (owner_of_page(move.page) != owner) {
      return Status(ErrorCode::internal, "commit_moves: pages of more than one allocation");
    }
  }
  std::vector<PageEntry> before(moves.size());
  for (size_t i = 0; i < moves.size(); ++i) {
    PageEntry entry = to[i];
    entry.generation = moves[i].from.generation;
    entry.flags = static_cast<uint8_t>((moves[i].from.flags & ~k_page_durable) | k_entry_present);
    if (to[i].tier == Tier::pmem) entry.flags |= k_page_durable;
    before[i] = *m_table.find(moves[i].page);
    m_table.set(moves[i].page, entry);
  }
  // One durable record for the whole run: every page moved, or none.
  if (owner != nullptr) {
    if (Status s = record(*owner); !s.ok()) {
      // Not moved: the caller aborts the moves and gives the new frames back.
      for (size_t i = 0; i < moves.size(); ++i) m_table.set(moves[i].page, before[i]);
      return s;
    }
  }
  for (size_t i = 0; i < moves.size(); ++i) {
    const PageMove& move = moves[i];
    m_table.clean(move.page);
    if (to[i].node == m_node) (void)m_loans.settle(to[i].tier, to[i].frame_offset);  // now in use
    version::unlock_new_epoch(m_versions->word(move.page), move.locked);
    if (move.from.node == m_node) {
      release_local_frame(move.from.tier, move.from.frame_offset, m_versions->domain_of(move.page));
    } else if (remote_frames != nullptr) {
      remote_frames->push_back({move.from.tier, move.from.node, move.from.frame_offset, 0, page_size()});
    }
  }
  return Status();
}

void AddressSpace::abort_move(const PageMove& move) {
  version::unlock_exclusive(m_versions->word(move.page), move.locked);
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
    stat.used_bytes = s.used * page_size();
    stat.free_bytes = stat.capacity_bytes - stat.used_bytes;
    stat.persistent = s.backend->persistent();
    stat.shareable = s.backend->per_domain();
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
  for (const auto& [start, a] : m_allocations) {
    d.allocations.push_back(info_of(a));
    for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) d.pages.push_back(page_info(p));
  }
  return d;
}

// --- frames of other nodes ---------------------------------------------------

void AddressSpace::note_lender(NodeId node, const std::string& tenant, uint64_t memory_generation) {
  std::unique_lock lock(m_mutex);
  m_loans.note(node, tenant, memory_generation);
}

size_t AddressSpace::lose_frames_of(NodeId node, const std::map<std::string, uint64_t>& generations) {
  std::unique_lock lock(m_mutex);
  // Tenants whose domain on `node` lent us frames from memory it no longer has.
  const std::set<std::string> gone = m_loans.lenders_gone(node, generations);
  if (gone.empty()) return 0;
  size_t lost = 0;
  for (auto& [start, a] : m_allocations) {
    // Shared pages are never on another node; a lender takes frames from
    // the domain of the allocation's tenant.
    if (a.slot_bytes != 0 || gone.count(a.tenant) == 0) continue;
    const uint64_t first = a.first_page;
    const uint64_t lost_before = a.lost_pages;
    for (uint64_t p = first; p < first + a.pages; ++p) {
      PageEntry e = *m_table.find(p);
      if (e.node != node || (e.flags & k_page_lost) != 0) continue;
      e.flags |= k_page_lost;
      // A new epoch tells cached translations; a writer still inside (its
      // frame is gone with the node anyway) is waited for briefly only.
      uint64_t locked = 0;
      const bool held = version::lock_exclusive_for(m_versions->word(p), std::chrono::milliseconds(100), &locked);
      m_table.set(p, e);
      if (held) version::unlock_new_epoch(m_versions->word(p), locked);
      ++a.lost_pages;
      ++lost;
    }
    if (a.lost_pages != lost_before) (void)record(a);
  }
  return lost;
}

bool AddressSpace::break_dead_lock(uint64_t page, uint64_t locked, const std::string& tenant, bool is_operator) {
  std::unique_lock lock(m_mutex);
  Allocation* owner = owner_of_page(page);
  if (owner == nullptr || (!is_operator && owner->tenant != tenant)) return false;
  if (!break_lock(m_versions->word(page), locked)) return false;
  PageEntry e = *m_table.find(page);
  if ((e.flags & k_page_torn) == 0) {
    e.flags |= k_page_torn;
    m_table.set(page, e);
    // The flag only: the lock is broken either way. On a shared page the
    // writer may have been inside any of its allocations.
    std::vector<Allocation*> hit{owner};
    if (m_slabs.contains(page)) {
      for (auto it = m_allocations.lower_bound(page * page_size());
           it != m_allocations.end() && it->second.first_page == page; ++it) {
        hit.push_back(&it->second);
      }
    }
    for (Allocation* a : hit) {
      ++a->torn_pages;
      (void)record(*a);
    }
  }
  return true;
}

}  // namespace tiermem
