// SpaceRecovery: an AddressSpace rebuilt from its durable metadata (see
// space_recovery.hpp).
#include "mapping/space_recovery.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include "pages/lock_intents.hpp"
#include "pages/version.hpp"

namespace tiermem {

bool SpaceRecovery::check_record(const AllocationRecord& r, std::string* why) const {
  const uint32_t domain = m_space.m_versions->domain_of(r.first_page);
  if (r.pages == 0 || r.first_page == 0 || r.first_page + r.pages > m_space.m_table.pages() ||
      m_space.m_versions->domain_of(r.first_page + r.pages - 1) != domain) {
    *why = "its pages lie outside one tenant's range";
    return false;
  }
  const DomainTable::Domain& dom = m_space.m_domains.at(domain);
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
  if (!r.name.empty() && !r.policy.is_copy() && m_space.m_names.count(r.name) != 0) {
    *why = "its name is taken twice";
    return false;
  }
  return true;
}

bool SpaceRecovery::take_back(const AllocationRecord& r, std::string* why) {
  const uint64_t psize = m_space.page_size();
  const uint32_t domain = m_space.m_versions->domain_of(r.first_page);
  DomainTable::Domain& dom = m_space.m_domains.at(domain);
  if (!dom.virtual_pages.reserve({r.first_page, r.pages})) {
    *why = "its virtual range overlaps another allocation's";
    return false;
  }
  // Local frames from their domain's free frames, all or none.
  std::vector<std::pair<Tier, UnitRange>> taken;
  const auto refuse = [&](const char* reason) {
    for (const auto& [tier, f] : taken) {
      for (uint64_t i = 0; i < f.count; ++i) m_space.release_local_frame(tier, (f.start + i) * psize, domain);
    }
    (void)dom.virtual_pages.release({r.first_page, r.pages});
    *why = reason;
    return false;
  };
  for (const RunRecord& run : r.runs) {
    if (run.node != m_space.m_node) continue;
    const auto t = static_cast<size_t>(run.tier);
    AddressSpace::TierState* ts = t < m_space.m_tiers.size() ? &m_space.m_tiers[t] : nullptr;
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

bool SpaceRecovery::settle_word(uint64_t page) {
  uint64_t& word = m_space.m_versions->word(page);
  if (!m_space.m_versions->adopted(m_space.m_versions->domain_of(page))) {
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

void SpaceRecovery::restore_pages(Allocation& a, const AllocationRecord& r) {
  const uint64_t psize = m_space.page_size();
  const uint32_t domain = m_space.m_versions->domain_of(r.first_page);
  uint64_t page = r.first_page;
  for (const RunRecord& run : r.runs) {
    // What the lender's domain was when it lent the frames: a peer that
    // comes back with that domain's memory made anew makes them lost
    // (lose_frames_of).
    if (run.node != m_space.m_node && run.memory_generation != 0) {
      m_space.m_loans.remember(run.node, r.tenant, run.memory_generation);
    }
    // Frames of a tier whose memory did not survive in this domain hold
    // nothing of what was written (take_back checked they are the domain's).
    for (uint64_t i = 0; i < run.pages; ++i, ++page) {
      PageEntry e;
      e.frame_offset = run.frame_offset + i * psize;
      const bool survived = run.node != m_space.m_node || frame_survived(domain, run.tier, e.frame_offset);
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
        ++m_report.locks_broken;
      }
      m_space.m_table.set(page, e);
    }
  }
}

SpaceRecovery::Allocation SpaceRecovery::from_record(const AllocationRecord& r) {
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
  a.policy = r.policy;
  return a;
}

void SpaceRecovery::note_recovered(const Allocation& a, const AllocationRecord& r) {
  if (a.lost_pages > r.lost_pages || a.torn_pages > r.torn_pages) {
    (void)m_space.m_meta->put_allocation(m_space.record_of(a), m_space.m_next_generation);  // the flags only
  }
  if (a.lost_pages == 0) return;
  ++m_report.lost_allocations;
  m_report.lost_pages += a.lost_pages;
  if (m_report.lost.size() >= 100) return;
  m_report.lost.push_back({a.tenant, (a.name.empty() ? std::string("(unnamed)") : "'" + a.name + "'") + " " +
                                           m_space.info_of(a).gva.to_string() + " of tenant '" + a.tenant +
                                           "': " + why_lost(a)});
}

std::string SpaceRecovery::why_lost(const Allocation& a) const {
  // The reason this start found for the first of its pages it lost (its
  // page entries are restored: a sub-page allocation's is its slab's).
  const uint32_t domain = m_space.m_versions->domain_of(a.first_page);
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    const PageEntry& e = *m_space.m_table.find(p);
    if (e.node == m_space.m_node && !frame_survived(domain, e.tier, e.frame_offset)) {
      return m_survival[domain].why[static_cast<size_t>(e.tier)];
    }
  }
  return "lost before this start";
}

bool SpaceRecovery::recover_allocation(const AllocationRecord& r, std::string* why) {
  if (r.kind == RecordKind::sub) return recover_in_slab(r, why);
  if (r.kind == RecordKind::slab && (r.pages != 1 || r.slot_bytes < k_min_slot_bytes ||
                                      r.slot_bytes > m_space.page_size() / 2 || !std::has_single_bit(r.slot_bytes))) {
    *why = "it is a shared page of an impossible size class";
    return false;
  }
  if (!check_record(r, why) || !take_back(r, why)) return false;
  Allocation a = from_record(r);
  restore_pages(a, r);
  DomainTable::Domain& dom = m_space.m_domains.at(m_space.m_versions->domain_of(r.first_page));
  dom.cursor = std::max(dom.cursor, r.first_page + r.pages);
  m_report.pages += a.pages;
  if (r.kind == RecordKind::slab) {
    // Filled by the records of the allocations in it, which follow.
    SlabSet::Slab slab = m_space.m_slabs.empty(r.slot_bytes);
    a.size = r.slot_bytes;
    slab.page = std::move(a);
    const Allocation& page = m_space.m_slabs.add(std::move(slab), /*open=*/false).page;  // opened by its allocations
    if (page.lost_pages > r.lost_pages || page.torn_pages > r.torn_pages) {
      (void)m_space.m_meta->put_allocation(m_space.record_of(page), m_space.m_next_generation);  // the flags only
    }
    return true;
  }
  ++m_space.m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty() && !a.policy.is_copy()) m_space.m_names.emplace(a.name, m_space.start_of(a));
  note_recovered(a, r);
  m_space.m_allocations.emplace(m_space.start_of(a), std::move(a));
  return true;
}

void SpaceRecovery::judge_domain(const DomainRecord& d) {
  DomainSurvival& out = m_survival[d.domain];
  const std::string whose = "domain " + std::to_string(d.domain) + " (tenant '" + d.tenant + "')";
  const bool adopted = m_space.m_versions->adopted(d.domain);
  if (!adopted) {
    m_report.domains_made_anew.push_back({d.tenant, whose + ": " + m_space.m_versions->made_anew_because(d.domain)});
  }
  for (Tier tier : k_tiers_fastest_first) {
    const auto t = static_cast<size_t>(tier);
    TierBackend* b = m_space.m_tiers[t].backend.get();
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
      out.why[t] = "the shared memory of " + whose + " was made anew: " + m_space.m_versions->made_anew_because(d.domain);
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

bool SpaceRecovery::frame_survived(uint32_t domain, Tier tier, uint64_t frame_offset) const {
  const auto t = static_cast<size_t>(tier);
  const DomainSurvival& d = m_survival[domain];
  if (!d.kept[t]) return false;
  const TierBackend& b = *m_space.m_tiers[t].backend;
  const uint64_t in_file = b.per_domain() ? frame_offset % b.domain_span() : frame_offset;
  return in_file + m_space.page_size() <= d.file_bytes[t];
}

RecoveryReport SpaceRecovery::run() {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(m_space.m_mutex);
  m_report.from_metadata = true;
  m_report.pool_created = m_image.created;
  m_report.starts = m_image.starts;
  m_report.pool = m_space.m_meta->describe();
  if (m_image.next_generation != 0) m_space.m_next_generation = m_image.next_generation;
  recover_domains();
  remove_unrecorded_domains();
  recover_allocations();
  release_empty_slabs();
  recover_lent();
  m_report.elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return std::move(m_report);
}

void SpaceRecovery::recover_domains() {
  m_survival.assign(m_space.m_domains.size(), {});
  m_report.memory_adopted = true;
  for (const DomainRecord& d : m_image.domains) {
    if (d.domain >= m_space.m_domains.size()) continue;
    judge_domain(d);
    m_report.memory_adopted = m_report.memory_adopted && m_space.m_versions->adopted(d.domain);
    if (Status s = m_space.open_domain_frames(d.domain, d.limit_pages); !s.ok()) {
      m_report.dropped_reasons.push_back("domain " + std::to_string(d.domain) + " of tenant '" + d.tenant +
                                         "': " + s.to_string());
      continue;
    }
    m_space.m_domains.assign(d.domain, d.tenant);
    m_space.m_versions->set_tenant(d.domain, d.tenant);
  }
}

void SpaceRecovery::remove_unrecorded_domains() {
  std::vector<bool> recorded(m_space.m_domains.size(), false);
  for (const DomainRecord& d : m_image.domains) {
    if (d.domain < recorded.size()) recorded[d.domain] = true;
  }
  for (uint32_t k = 0; k < m_space.m_domains.size(); ++k) {
    if (recorded[k]) continue;
    // Files no record speaks for (left by a run whose pool is gone): removed,
    // so a client still mapping one is left with an unlinked file.
    for (const AddressSpace::TierState& t : m_space.m_tiers) {
      if (t.backend && t.backend->per_domain()) t.backend->remove_domain_file(k);
    }
  }
}

void SpaceRecovery::recover_allocations() {
  for (const AllocationRecord& r : m_image.allocations) {
    std::string why;
    if (recover_allocation(r, &why)) {
      if (r.kind != RecordKind::slab) ++m_report.allocations;
      continue;
    }
    ++m_report.dropped;
    m_report.dropped_reasons.push_back(
        std::string(r.kind == RecordKind::slab ? "shared page " : "allocation at page ") + std::to_string(r.first_page) +
        (r.kind == RecordKind::sub ? " + " + std::to_string(r.page_offset) : "") +
        (r.name.empty() ? "" : " ('" + r.name + "')") + ": " + why);
    (void)m_space.m_meta->erase_allocation(r.first_page, r.page_offset, r.kind);
  }
}

void SpaceRecovery::recover_lent() {
  for (const LentRecord& l : m_image.lent) {
    const auto t = static_cast<size_t>(l.tier);
    AddressSpace::TierState* ts = t < m_space.m_tiers.size() ? &m_space.m_tiers[t] : nullptr;
    if (ts == nullptr || !ts->backend || l.domain >= m_space.m_domains.size()) continue;
    DomainTable::Domain& dom = m_space.m_domains.at(l.domain);
    ExtentSet& free = ts->backend->per_domain() ? dom.free_frames[t] : ts->shared_free;
    if (!free.reserve({l.frame, 1})) continue;
    ++ts->used;
    ++dom.used[t];
    m_space.m_loans.lend(l.tier, l.frame * m_space.page_size(), l.borrower, l.domain);
    ++m_report.lent_frames;
  }
}


bool SpaceRecovery::recover_in_slab(const AllocationRecord& r, std::string* why) {
  SlabSet::Slab* found = m_space.m_slabs.find(r.first_page);
  if (found == nullptr) {
    *why = "its shared page was not recovered";
    return false;
  }
  SlabSet::Slab& slab = *found;
  if (slab.page.tenant != r.tenant || r.slot_bytes != slab.page.size || r.page_offset % r.slot_bytes != 0 ||
      r.page_offset >= m_space.page_size() || r.size == 0 || r.size > r.slot_bytes || r.coherent != slab.page.coherent) {
    *why = "it does not fit its shared page (tenant, size class, kind or offset)";
    return false;
  }
  if (slab.slot_used(r.page_offset)) {
    *why = "its slot is taken twice";
    return false;
  }
  if (!r.name.empty() && m_space.m_names.count(r.name) != 0) {
    *why = "its name is taken twice";
    return false;
  }
  Allocation a = from_record(r);
  a.pages = 1;
  a.page_offset = r.page_offset;
  a.slot_bytes = r.slot_bytes;
  a.tier = slab.page.tier;
  // It is where its page is: lost or torn with it.
  const PageEntry& e = *m_space.m_table.find(r.first_page);
  if ((e.flags & k_page_lost) != 0) a.lost_pages = 1;
  if ((e.flags & k_page_torn) != 0) a.torn_pages = std::max<uint64_t>(a.torn_pages, 1);
  note_recovered(a, r);
  m_space.mark_slot(slab, a.page_offset, true);
  ++m_space.m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty()) m_space.m_names.emplace(a.name, m_space.start_of(a));
  m_space.m_allocations.emplace(m_space.start_of(a), std::move(a));
  return true;
}

void SpaceRecovery::release_empty_slabs() {
  for (const uint64_t page : m_space.m_slabs.pages()) {
    SlabSet::Slab& slab = *m_space.m_slabs.find(page);
    if (slab.in_use != 0) {
      slab.dirty_free_slots();  // what its free slots held before is unknown: zeroed when taken
      continue;
    }
    if (m_space.m_meta && !m_space.m_meta->erase_allocation(page, 0, RecordKind::slab).ok()) continue;  // kept, empty, for new ones
    const PageEntry e = *m_space.m_table.find(page);
    if (e.node == m_space.m_node) m_space.release_local_frame(e.tier, e.frame_offset, m_space.m_versions->domain_of(page));
    m_space.m_table.clear(page);
    version::advance_epoch(m_space.m_versions->word(page));
    (void)m_space.m_domains.at(m_space.m_versions->domain_of(page)).virtual_pages.release({page, 1});
    m_space.m_slabs.remove(page);
  }
}

}  // namespace tiermem
