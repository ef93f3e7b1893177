// AddressSpace: durable metadata (H5). Records of allocations and lent
// frames are written through MetadataStore before a change is visible; at a
// start the space is rebuilt from them: domains first (their files opened
// with the limits they had), then each allocation (its virtual range and
// local frames taken back, its page entries set), then the frames lent to
// other nodes. What the records point at is checked against the tiers: a
// record that does not fit (a range taken twice, a frame outside its domain)
// is dropped and logged by the caller; pages whose memory did not survive
// are flagged lost, so their allocation reads fail with data_lost and says
// so, never silently. What survived is judged per domain (one tenant's
// files): DRAM when the domain's shared memory was taken over and its DRAM
// file is whole, PMEM when its PMEM file is whole, VRAM never. A tenant that
// damaged its own files loses its own memory and no one else's.
#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include <tiermem/status_macros.h>

#include "mapping/address_space.hpp"
#include "pages/lock_intents.hpp"
#include "pages/version.hpp"

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

bool AddressSpace::check_record(const AllocationRecord& r, std::string* why) const {
  const uint32_t domain = m_versions->domain_of(r.first_page);
  if (r.pages == 0 || r.first_page == 0 || r.first_page + r.pages > m_table.pages() ||
      m_versions->domain_of(r.first_page + r.pages - 1) != domain) {
    *why = "its pages lie outside one tenant's range";
    return false;
  }
  const Domain& dom = m_domains.at(domain);
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
  Domain& dom = m_domains.at(domain);
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

bool AddressSpace::settle_word(uint64_t page) {
  uint64_t& word = m_versions->word(page);
  if (!m_versions->adopted(m_versions->domain_of(page))) {
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

void AddressSpace::restore_pages(Allocation& a, const AllocationRecord& r) {
  const uint64_t psize = page_size();
  const uint32_t domain = m_versions->domain_of(r.first_page);
  uint64_t page = r.first_page;
  for (const RunRecord& run : r.runs) {
    // What the lender's domain was when it lent the frames: a peer that
    // comes back with that domain's memory made anew makes them lost
    // (lose_frames_of).
    if (run.node != m_node && run.memory_generation != 0) {
      m_loans.remember(run.node, r.tenant, run.memory_generation);
    }
    // Frames of a tier whose memory did not survive in this domain hold
    // nothing of what was written (take_back checked they are the domain's).
    for (uint64_t i = 0; i < run.pages; ++i, ++page) {
      PageEntry e;
      e.frame_offset = run.frame_offset + i * psize;
      const bool survived = run.node != m_node || frame_survived(domain, run.tier, e.frame_offset);
      e.generation = r.generation;
      e.node = run.node;
      e.tier = run.tier;
      e.flags = static_cast<uint8_t>(run.flags | k_entry_present);
      if (!survived && (e.flags & k_page_lost) == 0) {
        e.flags |= k_page_lost;
        ++a.lost_pages;
      }
      if (settle_word(page) && (e.flags & k_page_torn) == 0) {
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
  if (a.lost_pages == 0) return;
  ++m_recovery.lost_allocations;
  m_recovery.lost_pages += a.lost_pages;
  if (m_recovery.lost.size() >= 100) return;
  m_recovery.lost.push_back({a.tenant, (a.name.empty() ? std::string("(unnamed)") : "'" + a.name + "'") + " " +
                                           info_of(a).gva.to_string() + " of tenant '" + a.tenant +
                                           "': " + why_lost(a)});
}

std::string AddressSpace::why_lost(const Allocation& a) const {
  // The reason this start found for the first of its pages it lost (its
  // page entries are restored: a sub-page allocation's is its slab's).
  const uint32_t domain = m_versions->domain_of(a.first_page);
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    const PageEntry& e = *m_table.find(p);
    if (e.node == m_node && !frame_survived(domain, e.tier, e.frame_offset)) {
      return m_survival[domain].why[static_cast<size_t>(e.tier)];
    }
  }
  return "lost before this start";
}

bool AddressSpace::recover_allocation(const AllocationRecord& r, std::string* why) {
  if (r.kind == RecordKind::sub) return recover_in_slab(r, why);
  if (r.kind == RecordKind::slab && (r.pages != 1 || r.slot_bytes < k_min_slot_bytes ||
                                      r.slot_bytes > page_size() / 2 || !std::has_single_bit(r.slot_bytes))) {
    *why = "it is a shared page of an impossible size class";
    return false;
  }
  if (!check_record(r, why) || !take_back(r, why)) return false;
  Allocation a = from_record(r);
  restore_pages(a, r);
  Domain& dom = m_domains.at(m_versions->domain_of(r.first_page));
  dom.cursor = std::max(dom.cursor, r.first_page + r.pages);
  m_recovery.pages += a.pages;
  if (r.kind == RecordKind::slab) {
    // Filled by the records of the allocations in it, which follow.
    Slab slab = m_slabs.empty(r.slot_bytes);
    a.size = r.slot_bytes;
    slab.page = std::move(a);
    const Allocation& page = m_slabs.add(std::move(slab), /*open=*/false).page;  // opened by its allocations
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

void AddressSpace::judge_domain(const DomainRecord& d) {
  DomainSurvival& out = m_survival[d.domain];
  const std::string whose = "domain " + std::to_string(d.domain) + " (tenant '" + d.tenant + "')";
  const bool adopted = m_versions->adopted(d.domain);
  if (!adopted) {
    m_recovery.domains_made_anew.push_back({d.tenant, whose + ": " + m_versions->made_anew_because(d.domain)});
  }
  for (Tier tier : k_tiers_fastest_first) {
    const auto t = static_cast<size_t>(tier);
    TierBackend* b = m_tiers[t].backend.get();
    if (b == nullptr) continue;
    const std::string name(tier_name(tier));
    if (!b->keeps_memory()) {
      // A tier whose frames are the daemon's own memory (VRAM) is gone with it.
      out.why[t] = name + " does not outlive its daemon";
      continue;
    }
    if (!b->persistent() && !adopted) {
      // Volatile frames are worth what the version words guarding them are:
      // with the words made anew, so is the file (as after a reboot), and a
      // client still mapping the old one is left with an unlinked file.
      out.why[t] = "the shared memory of " + whose + " was made anew: " + m_versions->made_anew_because(d.domain);
      if (b->per_domain()) b->remove_domain_file(d.domain);
      continue;
    }
    out.kept[t] = true;
    out.file_bytes[t] = b->per_domain() ? b->domain_file_bytes(d.domain) : ~uint64_t{0};
    out.why[t] = "the " + name + " file of " + whose +
                 (out.file_bytes[t] == 0 ? std::string(" is missing or empty")
                                         : " was cut short to " + std::to_string(out.file_bytes[t]) + " bytes") +
                 ": its frames past that are gone";
  }
}

bool AddressSpace::frame_survived(uint32_t domain, Tier tier, uint64_t frame_offset) const {
  const auto t = static_cast<size_t>(tier);
  const DomainSurvival& d = m_survival[domain];
  if (!d.kept[t]) return false;
  const TierBackend& b = *m_tiers[t].backend;
  const uint64_t in_file = b.per_domain() ? frame_offset % b.domain_span() : frame_offset;
  return in_file + page_size() <= d.file_bytes[t];
}

void AddressSpace::recover(const MetadataImage& image) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(m_mutex);
  m_recovery.from_metadata = true;
  m_recovery.pool_created = image.created;
  m_recovery.starts = image.starts;
  m_recovery.pool = m_meta->describe();
  if (image.next_generation != 0) m_next_generation = image.next_generation;
  m_survival.assign(m_domains.size(), {});
  m_recovery.memory_adopted = true;
  for (const DomainRecord& d : image.domains) {
    if (d.domain >= m_domains.size()) continue;
    judge_domain(d);
    m_recovery.memory_adopted = m_recovery.memory_adopted && m_versions->adopted(d.domain);
    if (Status s = open_domain_frames(d.domain, d.limit_pages); !s.ok()) {
      m_recovery.dropped_reasons.push_back("domain " + std::to_string(d.domain) + " of tenant '" + d.tenant +
                                           "': " + s.to_string());
      continue;
    }
    m_domains.assign(d.domain, d.tenant);
    m_versions->set_tenant(d.domain, d.tenant);
  }
  std::vector<bool> recorded(m_domains.size(), false);
  for (const DomainRecord& d : image.domains) {
    if (d.domain < recorded.size()) recorded[d.domain] = true;
  }
  for (uint32_t k = 0; k < m_domains.size(); ++k) {
    if (recorded[k]) continue;
    // Files no record speaks for (left by a run whose pool is gone): removed,
    // so a client still mapping one is left with an unlinked file.
    for (const TierState& t : m_tiers) {
      if (t.backend && t.backend->per_domain()) t.backend->remove_domain_file(k);
    }
  }
  for (const AllocationRecord& r : image.allocations) {
    std::string why;
    if (recover_allocation(r, &why)) {
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
    Domain& dom = m_domains.at(l.domain);
    ExtentSet& free = ts->backend->per_domain() ? dom.free_frames[t] : ts->shared_free;
    if (!free.reserve({l.frame, 1})) continue;
    ++ts->used;
    ++dom.used[t];
    m_loans.lend(l.tier, l.frame * page_size(), l.borrower, l.domain);
    ++m_recovery.lent_frames;
  }
  m_recovery.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tiermem
