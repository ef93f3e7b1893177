// AddressSpace: creation, allocation, free and reporting. Data access and
// translation are in address_space_access.cpp.
#include "mapping/address_space.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include "common/units.hpp"
#include "mapping/placement.hpp"
#include "mapping/version.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_min_virtual_pages = 4096;
constexpr uint64_t k_virtual_factor = 16;
// Lock wait when the daemon itself changes a page (free); clients hold a page
// lock only for the length of one page copy.
constexpr auto k_page_lock_timeout = std::chrono::seconds(2);

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
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
  auto versions = VersionArray::create(virtual_pages, "tiermem-versions");
  if (!versions.ok()) return versions.status();
  auto l3 = WordArray::create(virtual_pages * k_l3_words_per_page, "tiermem-l3");
  if (!l3.ok()) return l3.status();
  return std::unique_ptr<AddressSpace>(new AddressSpace(
      options, virtual_pages, std::move(tiers), std::move(versions).value(), std::move(l3).value()));
}

AddressSpace::AddressSpace(const AddressSpaceOptions& options, uint64_t virtual_pages,
                           TierSet tiers, VersionArray versions, WordArray l3)
    : m_node(options.node),
      m_versions(std::move(versions)),
      m_l3(std::move(l3)),
      m_table(virtual_pages, options.page_size, m_l3.words()),
      m_virtual(1, virtual_pages - 1) {  // page 0 stays unallocated: GVA offset 0 is null
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (!tiers[i]) continue;
    TierState& t = m_tiers[i];
    t.frames = tiers[i]->capacity() / options.page_size;
    t.free_frames = ExtentSet(0, t.frames);
    t.backend = std::move(tiers[i]);
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
  a.frames = std::move(frames);
  a.created_unix_ms = now_unix_ms();
  a.owner_uid = request.owner_uid;

  uint8_t flags = k_page_read | k_page_write | k_entry_present;
  if (tier.backend->persistent()) flags |= k_page_durable;
  uint64_t page = a.first_page;
  for (const UnitRange& f : a.frames) {
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

Status AddressSpace::free(Gva gva) {
  std::unique_lock lock(m_mutex);
  auto located = locate(gva);
  if (!located.ok()) return located.status();
  const Allocation& a = **located;
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
  // Lock every page first so no reader or writer is inside; then the new epoch
  // tells every cached translation that the page is gone.
  std::vector<uint64_t> locked(a.pages);
  for (uint64_t i = 0; i < a.pages; ++i) {
    if (!version::lock_for(m_versions.word(a.first_page + i), k_page_lock_timeout, &locked[i])) {
      for (uint64_t j = 0; j < i; ++j) version::unlock(m_versions.word(a.first_page + j), locked[j]);
      return Status(ErrorCode::busy, "page " + std::to_string(a.first_page + i) + " of " +
                                         info.gva.to_string() +
                                         " stayed locked by a writer; try again");
    }
  }
  TierState& tier = m_tiers[static_cast<size_t>(a.tier)];
  const uint64_t psize = page_size();
  Status discard_status;
  for (const UnitRange& f : a.frames) {
    // A failed discard only delays returning storage; the frames are still
    // cleared again on their next allocation.
    Status s = tier.backend->discard(f.start * psize, f.count * psize);
    if (discard_status.ok()) discard_status = s;
    tier.free_frames.release(f);
  }
  for (uint64_t i = 0; i < a.pages; ++i) {
    m_table.clear(a.first_page + i);
    version::unlock_new_epoch(m_versions.word(a.first_page + i), locked[i]);
  }
  m_virtual.release({a.first_page, a.pages});
  --tier.allocations;
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
  info.tier = a.tier;
  info.name = a.name;
  info.pages = a.pages;
  info.map_count = a.map_count;
  info.created_unix_ms = a.created_unix_ms;
  info.owner_uid = a.owner_uid;
  return info;
}

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
