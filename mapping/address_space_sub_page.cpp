// AddressSpace: sub-page allocations (M10).
//
// An allocation of at most sub_page_max bytes takes a slot of a shared page
// (a slab) instead of pages of its own. Slots are power-of-two size classes
// from k_min_slot_bytes, aligned to their size, so a slot never crosses a
// page and a word 8-byte aligned in an allocation is 8-byte aligned in
// memory. A slab belongs to one tenant's domain (its frame is in the
// tenant's files, so tenants never share a page), one tier and one kind
// (coherent or not: a coherent page's atomics take no lock). Each allocation
// in it has its own generation, name, owner, lifetime and record; they share
// the page's version word, so writers of neighbours serialize on it and
// readers of one retry when a neighbour is written (correct, at some cost in
// contention, which is what whole pages are for).
//
// Free: under the page's exclusive lock the record goes, then the page moves
// to a new epoch: every cached translation of the page is stale, so a client
// still holding the freed one refreshes and is refused (and the neighbours'
// clients translate once more). The slot is zeroed when it is taken again
// (under the lock), so nothing of a freed allocation shows through, also
// after a crash between the two. The last allocation's free gives the page
// back. The slab counts as one page of its tier against the tenant's quota.
// Shared pages are not migrated, replicated, or lent to other nodes.
#include <algorithm>
#include <bit>
#include <mutex>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "mapping/address_space.hpp"
#include "mapping/placement.hpp"
#include "pages/version.hpp"

namespace tiermem {

uint32_t AddressSpace::slot_class(const AllocRequest& request) const {
  if (m_sub_page_max == 0 || request.size > m_sub_page_max || request.policy.has_copies() ||
      request.policy.is_copy() || request.policy.demotable) {
    // Demotable ones take pages of their own: a shared page never moves.
    return 0;
  }
  return static_cast<uint32_t>(std::max<uint64_t>(k_min_slot_bytes, std::bit_ceil(request.size)));
}

void AddressSpace::mark_slot(Slab& slab, uint64_t page_offset, bool used) {
  const bool lost = (m_table.find(slab.page.first_page)->flags & k_page_lost) != 0;
  m_slabs.mark(slab, page_offset, used, !lost);
}

Result<AddressSpace::Slab*> AddressSpace::new_slab(const AllocRequest& request, uint32_t domain, Tier tier,
                                                   uint32_t slot_bytes) {
  std::vector<UnitRange> frames;
  if (!take_frames(tier, domain, 1, &frames)) return nullptr;
  Domain& dom = m_domains.at(domain);
  UnitRange virt;
  if (!dom.virtual_pages.take_next_fit(1, dom.cursor, &virt)) {
    release_local_frames(tier, frames, domain);
    return Status(ErrorCode::tier_exhausted, "node " + std::to_string(m_node) +
                                                 " has no free virtual page for a page of small allocations of tenant '" +
                                                 request.tenant + "'");
  }
  dom.cursor = virt.start + 1;
  if (Status s = prepare_frames(tier, frames); !s.ok()) {
    release_local_frames(tier, frames, domain);
    (void)dom.virtual_pages.release(virt);
    return s.with_context("a frame for a page of small allocations");
  }
  Slab fresh = m_slabs.empty(slot_bytes);
  // The page as a one-page allocation of the tenant, of nobody's name.
  AllocRequest page_request;
  page_request.size = slot_bytes;  // a slab's record keeps its size class here
  page_request.tenant = request.tenant;
  page_request.coherent = request.coherent;
  fresh.page = new_allocation(page_request, tier);
  Allocation& p = fresh.page;
  p.first_page = virt.start;
  p.pages = 1;
  map_new_pages(p, tier, frames);
  Slab& slab = m_slabs.add(std::move(fresh), /*open=*/false);
  if (Status s = record(slab.page); !s.ok()) {
    m_slabs.remove(virt.start);
    m_table.clear(virt.start);
    release_local_frames(tier, frames, domain);
    (void)dom.virtual_pages.release(virt);
    return s;
  }
  m_slabs.set_open(slab, true);
  return &slab;
}

Result<AllocationInfo> AddressSpace::allocate_in_slab(const AllocRequest& request, uint32_t slot_bytes) {
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, assign_domain(request.tenant, request.limits));
  const std::vector<Tier> chain = placement_chain(request.tier, request.strict);
  Slab* slab = nullptr;
  for (Tier t : chain) {
    if (!m_tiers[static_cast<size_t>(t)].backend) continue;
    slab = m_slabs.open_slab(domain, t, slot_bytes, request.coherent);
    if (slab != nullptr) break;
    TIERMEM_ASSIGN_OR_RETURN(slab, new_slab(request, domain, t, slot_bytes));
    if (slab != nullptr) break;
  }
  if (slab == nullptr) return exhausted_error(request, 1, chain, domain);
  const uint64_t page = slab->page.first_page;
  // Its first free slot (an open slab has one).
  const uint64_t index = slab->first_free().value_or(0);
  const auto give_back_empty = [&] {
    if (slab->in_use != 0) return;
    if (m_meta && !m_meta->erase_allocation(page, 0, RecordKind::slab).ok()) return;  // it stays, for the next
    const PageEntry e = *m_table.find(page);
    release_local_frame(e.tier, e.frame_offset, m_versions->domain_of(page));
    m_table.clear(page);
    version::advance_epoch(m_versions->word(page));
    (void)m_domains.at(domain).virtual_pages.release({page, 1});
    m_slabs.remove(page);
  };

  Allocation a = new_allocation(request, slab->page.tier);
  a.first_page = page;
  a.pages = 1;
  a.page_offset = index * slot_bytes;
  a.slot_bytes = slot_bytes;

  if (slab->slot_dirty(index)) {
    // A freed allocation's bytes: zeroed before anyone learns of the new one.
    uint64_t& word = m_versions->word(page);
    uint64_t locked = 0;
    if (!version::lock_exclusive_for(word, k_page_lock_timeout, &locked)) {
      return Status(ErrorCode::busy, "page " + std::to_string(page) +
                                         " of small allocations stayed locked by a writer; try again");
    }
    const PageEntry e = *m_table.find(page);
    const std::vector<std::byte> zeros(slot_bytes);
    Status s = m_local_frames[static_cast<size_t>(e.tier)]->write(e.frame_offset + a.page_offset, zeros.data(),
                                                                  zeros.size());
    version::unlock_exclusive(word, locked);
    if (!s.ok()) return s.with_context("clearing a slot for a new allocation");
    slab->clear_dirty(index);
  }
  // Recorded before anyone learns of it.
  if (Status s = record(a); !s.ok()) {
    give_back_empty();
    return s;
  }
  mark_slot(*slab, a.page_offset, true);
  ++m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty()) m_names.emplace(a.name, start_of(a));
  const AllocationInfo info = info_of(a);
  m_allocations.emplace(start_of(a), std::move(a));
  return info;
}

Status AddressSpace::free_in_slab(Allocation& a) {
  const uint64_t page = a.first_page;
  Slab& slab = *m_slabs.find(page);
  uint64_t& word = m_versions->word(page);
  uint64_t locked = 0;
  if (!version::lock_exclusive_for(word, k_page_lock_timeout, &locked)) {
    return Status(ErrorCode::busy, "page " + std::to_string(page) + " of " + info_of(a).gva.to_string() +
                                       " stayed locked by a writer; try again");
  }
  if (Status s = m_meta ? m_meta->erase_allocation(page, a.page_offset, RecordKind::sub) : Status(); !s.ok()) {
    version::unlock_exclusive(word, locked);
    return s;
  }
  // The page goes with its last allocation; when its record cannot be
  // erased it stays, empty, for the next one.
  const bool release =
      slab.in_use == 1 && (!m_meta || m_meta->erase_allocation(page, 0, RecordKind::slab).ok());
  --m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty()) m_names.erase(a.name);
  mark_slot(slab, a.page_offset, false);
  m_allocations.erase(start_of(a));  // `a` is gone from here on
  if (!release) {
    version::unlock_new_epoch(word, locked);
    return Status();
  }
  const uint32_t domain = m_versions->domain_of(page);
  const PageEntry e = *m_table.find(page);
  release_local_frame(e.tier, e.frame_offset, domain);
  m_table.clear(page);
  version::unlock_new_epoch(word, locked);
  (void)m_domains.at(domain).virtual_pages.release({page, 1});
  m_slabs.remove(page);
  return Status();
}

AddressSpace::Allocation* AddressSpace::owner_of_page(uint64_t page) {
  if (Slab* s = m_slabs.find(page); s != nullptr) return &s->page;
  auto it = m_allocations.upper_bound(page * page_size());
  if (it == m_allocations.begin()) return nullptr;
  Allocation& a = std::prev(it)->second;
  if (a.slot_bytes != 0 || page < a.first_page || page >= a.first_page + a.pages) return nullptr;
  return &a;
}

AddressSpace::SlabStats AddressSpace::slab_stats() const {
  std::shared_lock lock(m_mutex);
  SlabStats s;
  s.slabs = m_slabs.size();
  s.allocations = m_slabs.allocations();
  return s;
}

}  // namespace tiermem
