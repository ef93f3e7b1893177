// AddressSpace: durable metadata (H5). Records of allocations and lent
// frames are written through MetadataStore before a change is visible; at a
// start the space is rebuilt from them: domains first (their files opened
// with the limits they had), then each allocation (its virtual range and
// local frames taken back, its page entries set), then the frames lent to
// other nodes. What the records point at is checked against the tiers: a
// record that does not fit (a range taken twice, a frame outside its domain)
// is dropped and logged by the caller; pages whose memory did not survive
// (DRAM when the node's shared memory was made anew, a tier file that is
// gone) are flagged lost, so their allocation reads fail with data_lost and
// says so, never silently.
#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include <tiermem/status_macros.h>

#include "mapping/address_space.hpp"
#include "mapping/lock_intents.hpp"
#include "mapping/version.hpp"

namespace tiermem {

AllocationRecord AddressSpace::record_of(const Allocation& a) const {
  AllocationRecord r;
  r.first_page = a.first_page;
  r.page_offset = a.page_offset;
  r.slot_bytes = a.slot_bytes;
  if (a.slot_bytes != 0) {
    r.kind = RecordKind::sub;
  } else if (m_slabs.count(a.first_page) != 0 && &m_slabs.at(a.first_page).page == &a) {
    r.kind = RecordKind::slab;
    r.slot_bytes = static_cast<uint32_t>(m_slabs.at(a.first_page).page.size);
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
  r.replicas_wanted = a.replicas_wanted;
  r.replicas = a.replicas;
  r.replica_of = a.replica_of;
  r.replica_ready = a.replica_ready;
  r.qos = a.qos;
  const uint64_t psize = page_size();
  for (uint64_t p = a.first_page; r.kind != RecordKind::sub && p < a.first_page + a.pages; ++p) {
    const PageEntry& e = *m_table.find(p);
    RunRecord* last = r.runs.empty() ? nullptr : &r.runs.back();
    if (last != nullptr && last->node == e.node && last->tier == e.tier && last->flags == e.flags &&
        last->frame_offset + last->pages * psize == e.frame_offset) {
      ++last->pages;
    } else {
      uint64_t lender = 0;
      if (e.node != m_node) {
        auto g = m_lender_generation.find(e.node);
        lender = g == m_lender_generation.end() ? 0 : g->second;
      }
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

bool AddressSpace::check_record(const AllocationRecord& r, std::string* why) const {
  const uint32_t domain = m_versions->domain_of(r.first_page);
  if (r.pages == 0 || r.first_page == 0 || r.first_page + r.pages > m_table.pages() ||
      m_versions->domain_of(r.first_page + r.pages - 1) != domain) {
    *why = "its pages lie outside one tenant's range";
    return false;
  }
  const Domain& dom = m_domains[domain];
  if (!dom.assigned || dom.tenant != r.tenant) {
    *why = "its range belongs to no domain of tenant '" + r.tenant + "'";
    return false;
  }
  uint64_t covered = 0;
  for (const RunRecord& run : r.runs) covered += run.pages;
  if (covered != r.pages) {
    *why = "its page entries do not cover its pages";
    return false;
  }
  if (!r.name.empty() && r.replica_of.node == 0 && m_names.count(r.name) != 0) {
    *why = "its name is taken twice";
    return false;
  }
  return true;
}

bool AddressSpace::take_back(const AllocationRecord& r, std::string* why) {
  const uint64_t psize = page_size();
  const uint32_t domain = m_versions->domain_of(r.first_page);
  Domain& dom = m_domains[domain];
  if (!dom.virtual_pages.reserve({r.first_page, r.pages})) {
    *why = "its virtual range overlaps another allocation's";
    return false;
  }
  // Local frames from their domain's free frames, all or none.
  std::vector<std::pair<Tier, UnitRange>> taken;
  const auto refuse = [&](const char* reason) {
    for (const auto& [tier, f] : taken) {
      for (uint64_t i = 0; i < f.count; ++i) release_local_frame(tier, (f.start + i) * psize, domain);
    }
    (void)dom.virtual_pages.release({r.first_page, r.pages});
    *why = reason;
    return false;
  };
  for (const RunRecord& run : r.runs) {
    if (run.node != m_node) continue;
    const auto t = static_cast<size_t>(run.tier);
    TierState* ts = t < m_tiers.size() ? &m_tiers[t] : nullptr;
    if (ts == nullptr || !ts->backend || run.frame_offset % psize != 0 ||
        !ts->backend->contains(run.frame_offset, run.pages * psize)) {
      return refuse("a frame lies outside its tier");
    }
    ExtentSet& free = ts->backend->per_domain() ? dom.free_frames[t] : ts->shared_free;
    const UnitRange f{run.frame_offset / psize, run.pages};
    if ((ts->backend->per_domain() && ts->backend->domain_of(run.frame_offset) != domain) || !free.reserve(f)) {
      return refuse("a frame is not free in its tenant's files");
    }
    ts->used += f.count;
    dom.used[t] += f.count;
    taken.push_back({run.tier, f});
  }
  return true;
}

bool AddressSpace::settle_word(uint64_t page, bool memory_adopted) {
  uint64_t& word = m_versions->word(page);
  if (!memory_adopted) {
    version::advance_epoch(word);
    return false;
  }
  // Still locked after the grace period: its writer (a client, or the daemon
  // before, freeing or migrating the page) died inside a change that was
  // never acknowledged. An exclusive wait of the daemon before (the pending
  // bit) has nobody waiting any more.
  const uint64_t v = version::load(word);
  const bool broken = version::is_locked(v) && break_lock(word, v & ~version::k_exclusive_pending);
  version::WordRef(word).fetch_and(~version::k_exclusive_pending, std::memory_order_acq_rel);
  return broken;
}

void AddressSpace::restore_pages(Allocation& a, const AllocationRecord& r, bool memory_adopted) {
  const uint64_t psize = page_size();
  uint64_t page = r.first_page;
  for (const RunRecord& run : r.runs) {
    // What the lender's memory was when it lent the frames: a peer that
    // comes back with other memory makes them lost (lose_frames_of).
    if (run.node != m_node && run.memory_generation != 0) m_lender_generation.emplace(run.node, run.memory_generation);
    // DRAM frames (and frames of a tier whose file is gone) hold nothing of
    // what was written when the memory did not survive.
    const auto t = static_cast<size_t>(run.tier);
    const bool survived =
        run.node != m_node || (m_recovery_survived[t] && (memory_adopted || m_tiers[t].backend->persistent()));
    for (uint64_t i = 0; i < run.pages; ++i, ++page) {
      PageEntry e;
      e.frame_offset = run.frame_offset + i * psize;
      e.generation = r.generation;
      e.node = run.node;
      e.tier = run.tier;
      e.flags = static_cast<uint8_t>(run.flags | k_entry_present);
      if (!survived && (e.flags & k_page_lost) == 0) {
        e.flags |= k_page_lost;
        ++a.lost_pages;
      }
      if (settle_word(page, memory_adopted) && (e.flags & k_page_torn) == 0) {
        e.flags |= k_page_torn;
        ++a.torn_pages;
        ++m_recovery.locks_broken;
      }
      m_table.set(page, e);
    }
  }
}

AddressSpace::Allocation AddressSpace::from_record(const AllocationRecord& r) const {
  Allocation a;
  a.first_page = r.first_page;
  a.pages = r.pages;
  a.size = r.size;
  a.generation = r.generation;
  a.tier = r.tier;
  a.name = r.name;
  a.created_unix_ms = r.created_unix_ms;
  a.owner_uid = r.owner_uid;
  a.tenant = r.tenant;
  a.coherent = r.coherent;
  a.lost_pages = r.lost_pages;
  a.torn_pages = r.torn_pages;
  a.replicas_wanted = r.replicas_wanted;
  a.replicas = r.replicas;
  a.replica_of = r.replica_of;
  a.replica_ready = r.replica_ready;
  a.qos = r.qos;
  return a;
}

void AddressSpace::note_recovered(const Allocation& a, const AllocationRecord& r) {
  if (a.lost_pages > r.lost_pages || a.torn_pages > r.torn_pages) {
    (void)m_meta->put_allocation(record_of(a), m_next_generation);  // the flags only
  }
  if (a.lost_pages > 0) {
    ++m_recovery.lost_allocations;
    m_recovery.lost_pages += a.lost_pages;
    if (m_recovery.lost.size() < 100) {
      m_recovery.lost.push_back((a.name.empty() ? std::string("(unnamed)") : "'" + a.name + "'") + " " +
                                info_of(a).gva.to_string());
    }
  }
}

bool AddressSpace::recover_allocation(const AllocationRecord& r, bool memory_adopted, std::string* why) {
  if (r.kind == RecordKind::sub) return recover_in_slab(r, why);
  if (r.kind == RecordKind::slab && (r.pages != 1 || r.slot_bytes < k_min_slot_bytes ||
                                      r.slot_bytes > page_size() / 2 || !std::has_single_bit(r.slot_bytes))) {
    *why = "it is a shared page of an impossible size class";
    return false;
  }
  if (!check_record(r, why) || !take_back(r, why)) return false;
  Allocation a = from_record(r);
  restore_pages(a, r, memory_adopted);
  Domain& dom = m_domains[m_versions->domain_of(r.first_page)];
  dom.cursor = std::max(dom.cursor, r.first_page + r.pages);
  m_recovery.pages += a.pages;
  if (r.kind == RecordKind::slab) {
    // Filled by the records of the allocations in it, which follow.
    Slab slab = empty_slab(r.slot_bytes);
    a.size = r.slot_bytes;
    slab.page = std::move(a);
    const Allocation& page = m_slabs.emplace(r.first_page, std::move(slab)).first->second.page;
    if (page.lost_pages > r.lost_pages || page.torn_pages > r.torn_pages) {
      (void)m_meta->put_allocation(record_of(page), m_next_generation);  // the flags only
    }
    return true;
  }
  ++m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty() && a.replica_of.node == 0) m_names.emplace(a.name, start_of(a));
  note_recovered(a, r);
  m_allocations.emplace(start_of(a), std::move(a));
  return true;
}

void AddressSpace::recover(const MetadataImage& image, bool memory_adopted) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(m_mutex);
  m_recovery.from_metadata = true;
  m_recovery.pool_created = image.created;
  m_recovery.memory_adopted = memory_adopted;
  m_recovery.starts = image.starts;
  m_recovery.pool = m_meta->describe();
  if (image.next_generation != 0) m_next_generation = image.next_generation;
  m_recovery_survived.fill(true);
  for (size_t t = 0; t < m_tiers.size(); ++t) {
    // A tier whose frames are the daemon's own memory (VRAM) is gone with it.
    if (m_tiers[t].backend && !m_tiers[t].backend->keeps_memory()) m_recovery_survived[t] = false;
  }
  for (const DomainRecord& d : image.domains) {
    if (d.domain >= m_domains.size()) continue;
    Domain& dom = m_domains[d.domain];
    for (Tier tier : k_tiers_fastest_first) {
      const auto t = static_cast<size_t>(tier);
      const TierBackend* b = m_tiers[t].backend.get();
      if (b != nullptr && b->per_domain() && d.limit_pages[t] > 0 &&
          !b->domain_file_exists(d.domain, d.limit_pages[t] * page_size())) {
        m_recovery_survived[t] = false;
      }
    }
    if (Status s = open_domain_frames(d.domain, d.limit_pages); !s.ok()) {
      m_recovery.dropped_reasons.push_back("domain " + std::to_string(d.domain) + " of tenant '" + d.tenant +
                                           "': " + s.to_string());
      continue;
    }
    dom.assigned = true;
    dom.tenant = d.tenant;
    m_versions->set_tenant(d.domain, d.tenant);
    m_domain_of.emplace(d.tenant, d.domain);
  }
  for (const AllocationRecord& r : image.allocations) {
    std::string why;
    if (recover_allocation(r, memory_adopted, &why)) {
      if (r.kind != RecordKind::slab) ++m_recovery.allocations;
      continue;
    }
    ++m_recovery.dropped;
    m_recovery.dropped_reasons.push_back(
        std::string(r.kind == RecordKind::slab ? "shared page " : "allocation at page ") + std::to_string(r.first_page) +
        (r.kind == RecordKind::sub ? " + " + std::to_string(r.page_offset) : "") +
        (r.name.empty() ? "" : " ('" + r.name + "')") + ": " + why);
    (void)m_meta->erase_allocation(r.first_page, r.page_offset, r.kind);
  }
  release_empty_slabs();
  for (const LentRecord& l : image.lent) {
    const auto t = static_cast<size_t>(l.tier);
    TierState* ts = t < m_tiers.size() ? &m_tiers[t] : nullptr;
    if (ts == nullptr || !ts->backend || l.domain >= m_domains.size()) continue;
    Domain& dom = m_domains[l.domain];
    ExtentSet& free = ts->backend->per_domain() ? dom.free_frames[t] : ts->shared_free;
    if (!free.reserve({l.frame, 1})) continue;
    ++ts->used;
    ++dom.used[t];
    m_lent[{static_cast<uint8_t>(l.tier), l.frame * page_size()}] = {l.borrower, l.domain};
    ++m_recovery.lent_frames;
  }
  m_recovery.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tiermem
