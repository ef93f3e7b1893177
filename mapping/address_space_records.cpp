// AddressSpace: durable metadata (H5). Records of allocations and lent
// frames are written through MetadataStore before a change is visible; at a
// start the space is rebuilt from them by SpaceRecovery (space_recovery.hpp).
#include "mapping/address_space.hpp"

namespace tiermem {

AllocationRecord AddressSpace::record_of(const Allocation& a) const {
  AllocationRecord r;
  r.first_page = a.first_page;
  r.page_offset = a.page_offset;
  r.slot_bytes = a.slot_bytes;
  if (a.slot_bytes != 0) {
    r.kind = RecordKind::sub;
  } else if (const Slab* slab = m_slabs.find(a.first_page); slab != nullptr && &slab->page == &a) {
    r.kind = RecordKind::slab;
    r.slot_bytes = static_cast<uint32_t>(slab->page.size);
  }
  r.pages = a.pages;
  r.size = a.size;
  r.generation = a.generation;
  r.tier = a.tier;
  r.coherent = a.coherent;
  r.owner_uid = a.owner_uid;
  r.created_unix_ms = a.created_unix_ms;
  r.lost_pages = a.lost_pages;
  r.torn_pages = a.torn_pages;
  r.tenant = a.tenant;
  r.name = a.name;
  r.policy = a.policy;
  const uint64_t psize = page_size();
  for (uint64_t p = a.first_page; r.kind != RecordKind::sub && p < a.first_page + a.pages; ++p) {
    const PageEntry& e = *m_table.find(p);
    RunRecord* last = r.runs.empty() ? nullptr : &r.runs.back();
    if (last != nullptr && last->node == e.node && last->tier == e.tier && last->flags == e.flags &&
        last->frame_offset + last->pages * psize == e.frame_offset) {
      ++last->pages;
    } else {
      uint64_t lender = 0;
      if (e.node != m_node) lender = m_loans.lender_generation(e.node, a.tenant);
      r.runs.push_back({e.frame_offset, 1, e.node, e.tier, e.flags, lender});
    }
  }
  return r;
}

Status AddressSpace::record(const Allocation& a) {
  if (!m_meta || a.session) return Status();
  return m_meta->put_allocation(record_of(a), m_next_generation);
}

Status AddressSpace::record_lent(Tier tier, const std::vector<UnitRange>& frames, NodeId borrower, uint32_t domain) {
  if (!m_meta || borrower == m_node) return Status();  // frames moving here are not kept over a restart
  std::vector<uint64_t> numbers;
  for (const UnitRange& f : frames) {
    for (uint64_t i = 0; i < f.count; ++i) numbers.push_back(f.start + i);
  }
  return m_meta->set_lent(tier, numbers, borrower, domain);
}

}  // namespace tiermem
