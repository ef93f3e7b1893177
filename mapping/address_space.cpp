// AddressSpace: creation, tenants' domains, allocation and free. Frames,
// lending, migration steps and reporting are in address_space_frames.cpp;
// translation and data access in address_space_access.cpp.
#include "mapping/address_space.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <mutex>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/random.hpp"
#include "mapping/placement.hpp"
#include "mapping/space_recovery.hpp"
#include "pages/version.hpp"

namespace tiermem {
namespace {

constexpr uint64_t k_min_virtual_pages = 4096;
constexpr uint64_t k_virtual_factor = 16;

uint64_t now_unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

Status check_tiers(const TierSet& tiers, uint64_t page_size, uint32_t domains, uint64_t* frames) {
  *frames = 0;
  for (const auto& t : tiers) {
    if (!t) continue;
    if (t->capacity() < page_size) {
      return Status(ErrorCode::invalid_argument, std::string(tier_name(t->tier())) + " tier of " +
                                                     format_size(t->capacity()) + " is smaller than one page (" +
                                                     format_size(page_size) + ")");
    }
    if (t->per_domain() ? t->domains() != domains : t->domains() != 1) {
      return Status(ErrorCode::invalid_argument, std::string(tier_name(t->tier())) + " tier has " +
                                                     std::to_string(t->domains()) + " domains, the address space " +
                                                     std::to_string(domains));
    }
    if (t->per_domain() && t->domain_span() % page_size != 0) {
      return Status(ErrorCode::invalid_argument, "page size " + format_size(page_size) + " does not divide the " +
                                                     std::string(tier_name(t->tier())) + " domain span");
    }
    *frames += t->capacity() / page_size;
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<AddressSpace>> AddressSpace::create(const AddressSpaceOptions& options, TierSet tiers) {
  if (!std::has_single_bit(options.page_size) || options.page_size < 4096) {
    return Status(ErrorCode::invalid_argument,
                  "page size " + std::to_string(options.page_size) +
                      " must be a power of two of at least 4096 bytes");
  }
  if (options.domains == 0) return Status(ErrorCode::invalid_argument, "the address space needs a domain");
  if (options.sub_page_max > options.page_size / 2) {
    return Status(ErrorCode::invalid_argument, "sub-page allocations of up to " + format_size(options.sub_page_max) +
                                                   " do not fit twice in a page of " + format_size(options.page_size) +
                                                   " (at most half a page)");
  }
  uint64_t frames = 0;
  TIERMEM_RETURN_IF_ERROR(check_tiers(tiers, options.page_size, options.domains, &frames));
  uint64_t per_domain = options.pages_per_domain;
  if (per_domain == 0) per_domain = std::max(k_min_virtual_pages, frames * k_virtual_factor);
  per_domain = round_up(per_domain, k_pages_per_domain_unit);
  std::unique_ptr<MetadataStore> meta;
  if (options.metadata) {
    MetadataGeometry g;
    g.node = options.node;
    g.page_size = options.page_size;
    g.domains = options.domains;
    g.pages_per_domain = per_domain;
    for (size_t i = 0; i < tiers.size(); ++i) {
      // Frame numbers run over every domain's span (a domain's files may be
      // smaller than its span).
      const TierBackend* t = tiers[i].get();
      if (t != nullptr) g.tier_frames[i] = (t->per_domain() ? t->domains() * t->domain_span() : t->capacity()) / options.page_size;
    }
    TIERMEM_ASSIGN_OR_RETURN(meta, open_pmem_metadata(*options.metadata, g));
  }
  // A tenant may have grown its files past its quota before this start and
  // filled their file system: that growth goes before anything here needs
  // storage there (version words, headers). A file that cannot be cut is
  // met again when its domain opens.
  if (meta && !meta->image().created) {
    for (const DomainRecord& d : meta->image().domains) {
      for (size_t i = 0; i < tiers.size(); ++i) {
        if (tiers[i] && tiers[i]->per_domain() && d.limit_pages[i] > 0) {
          (void)tiers[i]->trim_unopened(d.domain, d.limit_pages[i] * options.page_size);
        }
      }
    }
  }
  VersionSegments::Options vo;
  vo.dir = options.versions_dir;
  vo.node = options.node;
  vo.domains = options.domains;
  vo.pages_per_domain = per_domain;
  vo.page_size = options.page_size;
  vo.incarnation = options.incarnation;
  // Each domain's shared memory is taken over when it is the very memory the
  // records describe (its generation); else it is made anew (a reboot,
  // someone removed it, or its tenant damaged its files), alone.
  if (meta && !meta->image().created) vo.adopt = meta->image().memory_generations;
  TIERMEM_ASSIGN_OR_RETURN(auto versions, VersionSegments::create(vo));
  if (meta && meta->image().memory_generations != versions->memory_generations()) {
    TIERMEM_RETURN_IF_ERROR(meta->set_memory_generations(versions->memory_generations()));
  }
  auto space =
      std::unique_ptr<AddressSpace>(new AddressSpace(options, per_domain, std::move(tiers), std::move(versions)));
  if (meta) {
    space->m_meta = std::move(meta);
    space->m_recovery = SpaceRecovery(*space, space->m_meta->image()).run();
  }
  return space;
}

AddressSpace::AddressSpace(const AddressSpaceOptions& options, uint64_t pages_per_domain, TierSet tiers,
                           std::unique_ptr<VersionSegments> versions)
    : m_node(options.node),
      m_versions(std::move(versions)),
      m_table(m_versions->pages(), options.page_size, m_versions->l3()),
      m_domains(options.domains, pages_per_domain),
      m_next_generation(options.first_generation != 0 ? options.first_generation
                                                      : static_cast<uint32_t>(random_nonzero() | 1)),
      m_slabs(options.page_size, m_versions->pages_per_domain()),
      m_local_words(m_versions->words().data(), m_versions->pages(), m_versions->l3().data(), options.page_size) {
  m_sub_page_max = options.sub_page_max;
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (!tiers[i]) continue;
    TierState& t = m_tiers[i];
    t.frames = tiers[i]->capacity() / options.page_size;
    if (!tiers[i]->per_domain()) t.shared_free = ExtentSet(0, t.frames);
    t.backend = std::move(tiers[i]);
    m_local_frames[i].emplace(*t.backend);
  }
}

// --- tenants' domains ---------------------------------------------------------

uint64_t AddressSpace::frame_pages_of(Tier tier, uint32_t, const TenantLimits& limits) const {
  const TierState& t = m_tiers[static_cast<size_t>(tier)];
  const uint64_t limit = limits.of(tier);
  return limit == 0 ? t.frames : std::min(t.frames, limit / page_size());
}

Status AddressSpace::open_domain_files(uint32_t domain, const TenantLimits& limits) {
  std::array<uint64_t, 4> limit_pages{};
  for (Tier tier : k_tiers_fastest_first) {
    const auto i = static_cast<size_t>(tier);
    limit_pages[i] = m_tiers[i].backend ? frame_pages_of(tier, domain, limits) : 0;
  }
  return open_domain_frames(domain, limit_pages);
}

Status AddressSpace::open_domain_frames(uint32_t domain, const std::array<uint64_t, 4>& limit_pages) {
  Domain& d = m_domains.at(domain);
  for (Tier tier : k_tiers_fastest_first) {
    TierState& t = m_tiers[static_cast<size_t>(tier)];
    const auto i = static_cast<size_t>(tier);
    d.limit[i] = t.backend ? std::min(limit_pages[i], t.frames) : 0;
    if (!t.backend || !t.backend->per_domain() || d.limit[i] == 0) continue;
    TIERMEM_RETURN_IF_ERROR(t.backend->open_domain(domain, d.limit[i] * page_size()));
    const uint64_t first = uint64_t{domain} * t.backend->domain_span() / page_size();
    d.free_frames[i] = ExtentSet(first, d.limit[i]);
  }
  return Status();
}

Result<uint32_t> AddressSpace::assign_domain(const std::string& tenant, const TenantLimits& limits) {
  if (auto held = m_domains.find(tenant)) return *held;
  if (auto free = m_domains.unassigned()) {
    const uint32_t k = *free;
    TIERMEM_RETURN_IF_ERROR(open_domain_files(k, limits));
    if (m_meta) {
      TIERMEM_RETURN_IF_ERROR(m_meta->put_domain({k, tenant, m_domains.at(k).limit}));
    }
    m_domains.assign(k, tenant);
    m_versions->set_tenant(k, tenant);
    return k;
  }
  return Status(ErrorCode::tier_exhausted, "node " + std::to_string(m_node) + " already holds " +
                                               std::to_string(m_domains.size()) +
                                               " tenants, the most it can (tenants.max_per_node); tenant '" + tenant +
                                               "' has no room here");
}

Result<uint32_t> AddressSpace::domain_for(const std::string& tenant, const TenantLimits& limits, bool* fresh) {
  std::unique_lock lock(m_mutex);
  const bool had = m_domains.find(tenant).has_value();
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, assign_domain(tenant, limits));
  if (fresh != nullptr) *fresh = !had;
  return domain;
}

std::optional<uint32_t> AddressSpace::find_domain(const std::string& tenant) const {
  std::shared_lock lock(m_mutex);
  return m_domains.find(tenant);
}

std::string AddressSpace::tenant_of_domain(uint32_t domain) const {
  std::shared_lock lock(m_mutex);
  return m_domains.tenant_of(domain);
}

std::vector<AddressSpace::FileTrim> AddressSpace::trim_tenant_files() {
  std::vector<FileTrim> out;
  {
    std::shared_lock lock(m_mutex);
    trim_tenant_files_locked();
  }
  std::lock_guard trims(m_trims_mutex);
  out.swap(m_trims);
  return out;
}

bool AddressSpace::trim_tenant_files_locked() {
  bool freed = false;
  auto note = [&](uint32_t d, const Result<SegmentTrim>& t, const std::string& path, uint64_t size) {
    if (t.ok() && !t->trimmed) return;
    FileTrim f;
    f.tenant = m_domains.tenant_of(d);
    f.path = path;
    f.size = size;
    if (!t.ok()) {
      f.error = t.status();
    } else {
      f.found_bytes = t->size_before;
      f.storage_freed = t->storage_before > t->storage_after ? t->storage_before - t->storage_after : 0;
      freed |= f.storage_freed > 0;
    }
    std::lock_guard trims(m_trims_mutex);
    if (m_trims.size() < 1000) m_trims.push_back(std::move(f));
  };
  for (uint32_t d = 0; d < m_domains.size(); ++d) {
    if (!m_domains.at(d).assigned) continue;
    for (Tier tier : {Tier::dram, Tier::pmem}) {
      TierBackend* b = m_tiers[static_cast<size_t>(tier)].backend.get();
      if (b == nullptr || !b->per_domain()) continue;
      std::string path;
      note(d, b->trim_domain_file(d, &path), path, b->domain_bytes(d));
    }
    std::string path;
    note(d, m_versions->trim_words(d, &path), path, m_versions->file_bytes());
  }
  return freed;
}

DomainFiles AddressSpace::domain_files(uint32_t domain) const {
  std::shared_lock lock(m_mutex);
  DomainFiles f;
  f.domain = domain;
  f.first_page = uint64_t{domain} * m_versions->pages_per_domain();
  f.pages = m_versions->pages_per_domain();
  f.versions_fd = m_versions->fd(domain);
  f.versions_bytes = m_versions->file_bytes();
  f.header_fd = m_versions->header_fd(domain);
  for (Tier tier : k_tiers_fastest_first) {
    const TierBackend* b = m_tiers[static_cast<size_t>(tier)].backend.get();
    if (b == nullptr || b->share_fd(domain) < 0) continue;
    f.tiers.push_back({tier, b->share_fd(domain), uint64_t{domain} * b->domain_span(), b->domain_bytes(domain),
                       b->persistent()});
  }
  return f;
}

uint64_t AddressSpace::usage(const std::string& tenant, Tier tier) const {
  std::shared_lock lock(m_mutex);
  return m_domains.used_pages(tenant, tier) * page_size();
}

// --- allocation ---------------------------------------------------------------

Status AddressSpace::exhausted_error(const AllocRequest& request, uint64_t pages, const std::vector<Tier>& chain,
                                     uint32_t domain) const {
  std::string msg = "cannot allocate " + format_size(request.size) + " (" + std::to_string(pages) +
                    (pages == 1 ? " page" : " pages") + " of " + format_size(page_size()) + ") on node " +
                    std::to_string(m_node) + ":";
  bool any_present = false, only_quota = true;
  const Domain& d = m_domains.at(domain);
  for (size_t i = 0; i < chain.size(); ++i) {
    const auto t = static_cast<size_t>(chain[i]);
    const TierState& ts = m_tiers[t];
    msg += i == 0 ? " " : ", ";
    msg += tier_name(chain[i]);
    if (!ts.backend) {
      msg += " not configured";
      continue;
    }
    any_present = true;
    if (d.limit[t] < ts.frames && d.used[t] + pages > d.limit[t]) {
      msg += " quota of tenant '" + request.tenant + "' " + format_size(d.limit[t] * page_size()) + ", " +
             format_size(d.used[t] * page_size()) + " used";
    } else {
      only_quota = false;
      msg += " has " + std::to_string(ts.frames - ts.used) + " of " + std::to_string(ts.frames) + " pages free";
    }
  }
  if (request.strict && request.tier != Tier::automatic) {
    msg += "; strict placement forbids falling back to a slower tier";
  }
  if (!any_present) return Status(ErrorCode::tier_unavailable, msg + " (enable the tier in tiermemd.toml)");
  if (only_quota) return Status(ErrorCode::quota_exceeded, msg + " (free some of the tenant's memory)");
  return Status(ErrorCode::tier_exhausted, msg + " (free memory or allow fallback)");
}

Result<AllocationInfo> AddressSpace::allocate(const AllocRequest& request) {
  if (request.size == 0) return Status(ErrorCode::invalid_argument, "cannot allocate 0 bytes");
  const uint64_t psize = page_size();
  if (request.size > (uint64_t{1} << 62)) {
    return Status(ErrorCode::invalid_argument, "size " + std::to_string(request.size) + " is absurdly large");
  }
  const uint64_t pages = (request.size + psize - 1) / psize;
  if (request.name.size() > 255) {
    return Status(ErrorCode::invalid_argument, "allocation names are at most 255 bytes; this one has " +
                                                   std::to_string(request.name.size()));
  }

  std::unique_lock lock(m_mutex);
  // A copy keeps its home's name (so it can be found while the home is
  // away: list()), outside the index of this node's own names.
  const bool indexed = !request.name.empty() && !request.policy.is_copy();
  if (indexed && m_names.count(request.name) != 0) {
    const Allocation& other = m_allocations.at(m_names.at(request.name));
    return Status(ErrorCode::already_exists,
                  "name '" + request.name + "' is already used by " + info_of(other).gva.to_string());
  }
  if (const uint32_t slot = slot_class(request); slot != 0) return allocate_in_slab(request, slot);
  TIERMEM_ASSIGN_OR_RETURN(const uint32_t domain, assign_domain(request.tenant, request.limits));
  Domain& dom = m_domains.at(domain);
  const std::vector<Tier> chain = placement_chain(request.tier, request.strict);
  Tier chosen = Tier::automatic;
  std::vector<UnitRange> frames;
  for (Tier t : chain) {
    if (take_frames(t, domain, pages, &frames)) {
      chosen = t;
      break;
    }
  }
  if (chosen == Tier::automatic) return exhausted_error(request, pages, chain, domain);
  TierState& tier = m_tiers[static_cast<size_t>(chosen)];

  UnitRange virt;
  if (!dom.virtual_pages.take_next_fit(pages, dom.cursor, &virt)) {
    release_local_frames(chosen, frames, domain);
    return Status(ErrorCode::tier_exhausted,
                  "node " + std::to_string(m_node) + " has no free virtual range of " + std::to_string(pages) +
                      " pages for tenant '" + request.tenant + "' (" + std::to_string(dom.virtual_pages.free_units()) +
                      " free in " + std::to_string(dom.virtual_pages.fragments()) + " pieces)");
  }
  dom.cursor = virt.start + virt.count;

  if (Status s = prepare_frames(chosen, frames); !s.ok()) {
    release_local_frames(chosen, frames, domain);
    (void)dom.virtual_pages.release(virt);
    return s.with_context("frames for a new allocation");
  }

  Allocation a = new_allocation(request, chosen);
  a.first_page = virt.start;
  a.pages = pages;

  map_new_pages(a, chosen, frames);
  // Recorded before anyone learns of it: a failure undoes it all.
  if (Status s = record(a); !s.ok()) {
    for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) m_table.clear(p);
    release_local_frames(chosen, frames, domain);
    (void)dom.virtual_pages.release(virt);
    return s;
  }
  ++tier.allocations;
  if (indexed) m_names.emplace(a.name, start_of(a));
  const AllocationInfo info = info_of(a);
  m_allocations.emplace(start_of(a), std::move(a));
  return info;
}

AddressSpace::Allocation AddressSpace::new_allocation(const AllocRequest& request, Tier tier) {
  Allocation a;
  a.size = request.size;
  a.generation = m_next_generation++;
  if (m_next_generation == 0) m_next_generation = 1;  // 0 means "unchecked"
  a.tier = tier;
  a.name = request.name;
  a.created_unix_ms = now_unix_ms();
  a.owner_uid = request.owner_uid;
  a.tenant = request.tenant;
  a.coherent = request.coherent;
  a.session = request.session;
  a.policy = request.policy;
  return a;
}

void AddressSpace::map_new_pages(const Allocation& a, Tier tier, const std::vector<UnitRange>& frames) {
  uint8_t flags = k_page_read | k_page_write | k_entry_present;
  if (m_tiers[static_cast<size_t>(tier)].backend->persistent()) flags |= k_page_durable;
  if (a.coherent) flags |= k_page_coherent;
  uint64_t page = a.first_page;
  for (const UnitRange& f : frames) {
    for (uint64_t i = 0; i < f.count; ++i, ++page) {
      PageEntry e;
      e.frame_offset = (f.start + i) * page_size();
      e.generation = a.generation;
      e.node = m_node;
      e.tier = tier;
      e.flags = flags;
      // Nobody holds a free page's lock (its epoch moved on when it was
      // freed), so the word is moved to the next epoch without waiting: a
      // client that scribbled on it cannot make the daemon wait.
      m_table.set(page, e);
      version::advance_epoch(m_versions->word(page));
    }
  }
}

Status AddressSpace::free(Gva gva, std::vector<Extent>* remote_frames) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(Allocation* located, locate(gva));
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
  if (a.slot_bytes != 0) return free_in_slab(a);
  // Lock every page first so no reader or writer is inside; then the new epoch
  // tells every cached translation that the page is gone.
  std::vector<uint64_t> locked(a.pages);
  for (uint64_t i = 0; i < a.pages; ++i) {
    if (!version::lock_exclusive_for(m_versions->word(a.first_page + i), k_page_lock_timeout, &locked[i])) {
      for (uint64_t j = 0; j < i; ++j) version::unlock_exclusive(m_versions->word(a.first_page + j), locked[j]);
      return Status(ErrorCode::busy, "page " + std::to_string(a.first_page + i) + " of " +
                                         info.gva.to_string() +
                                         " stayed locked by a writer; try again");
    }
  }
  // Gone from the records first: after a crash from here on, it does not
  // come back (its frames are free at the next start).
  if (Status s = m_meta ? m_meta->erase_allocation(a.first_page) : Status(); !s.ok()) {
    for (uint64_t i = 0; i < a.pages; ++i) version::unlock_exclusive(m_versions->word(a.first_page + i), locked[i]);
    return s;
  }
  const uint32_t domain = m_versions->domain_of(a.first_page);
  for (uint64_t i = 0; i < a.pages; ++i) {
    const uint64_t page = a.first_page + i;
    const PageEntry e = *m_table.find(page);
    if (e.node == m_node) {
      release_local_frame(e.tier, e.frame_offset, domain);
    } else if (remote_frames != nullptr && (e.flags & k_page_lost) == 0) {
      remote_frames->push_back({e.tier, e.node, e.frame_offset, 0, page_size()});
    }
    m_table.clear(page);
    version::unlock_new_epoch(m_versions->word(page), locked[i]);
  }
  (void)m_domains.at(domain).virtual_pages.release({a.first_page, a.pages});
  --m_tiers[static_cast<size_t>(a.tier)].allocations;
  if (!a.name.empty() && !a.policy.is_copy()) m_names.erase(a.name);
  m_allocations.erase(start_of(a));
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
  info.gva.offset = start_of(a);
  info.size = a.size;
  info.slot_bytes = a.slot_bytes;
  const PageEntry* first = m_table.find(a.first_page);
  info.tier = first != nullptr && first->present() ? first->tier : a.tier;
  info.name = a.name;
  info.pages = a.pages;
  info.map_count = a.map_count;
  info.created_unix_ms = a.created_unix_ms;
  info.owner_uid = a.owner_uid;
  info.tenant = a.tenant;
  info.lost_pages = a.lost_pages;
  info.torn_pages = a.torn_pages;
  info.lifetime = a.session ? Lifetime::session : Lifetime::persistent;
  info.replicas_wanted = a.policy.replicas_wanted;
  info.replicas = a.policy.replicas;
  info.replica_of = a.policy.replica_of;
  info.replica_ready = a.policy.replica_ready;
  info.qos = a.policy.qos;
  info.demotable = a.policy.demotable;
  return info;
}

Status AddressSpace::change_policy(Gva base, const std::function<void(AllocationPolicy&)>& change) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(Allocation* a, locate(base));
  AllocationPolicy before = a->policy;
  change(a->policy);
  if (Status s = record(*a); !s.ok()) {
    a->policy = std::move(before);
    return s;
  }
  return Status();
}

Result<uint64_t> AddressSpace::refill_lost(Gva base, std::span<const std::byte> bytes) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(Allocation* a, locate(base));
  if (bytes.size() != a->size) {
    return Status(ErrorCode::invalid_argument, "refill of " + std::to_string(bytes.size()) + " bytes for an allocation of " +
                                                   std::to_string(a->size));
  }
  // Nobody reads or writes the frames meanwhile: an allocation with lost
  // pages is refused (data_lost) before its frames are touched.
  const uint64_t psize = page_size();
  uint64_t refilled = 0;
  for (uint64_t i = 0; i < a->pages; ++i) {
    const uint64_t page = a->first_page + i;
    PageEntry e = *m_table.find(page);
    if ((e.flags & k_page_lost) == 0 || e.node != m_node) continue;
    TIERMEM_ASSIGN_OR_RETURN(FrameData* frames_here, frames(m_node, e.tier, nullptr));
    const uint64_t offset = i * psize;
    TIERMEM_RETURN_IF_ERROR(
        frames_here->write(e.frame_offset, bytes.data() + offset, std::min<uint64_t>(psize, a->size - offset)));
    e.flags &= ~k_page_lost;
    m_table.set(page, e);
    --a->lost_pages;
    ++refilled;
  }
  if (refilled > 0) TIERMEM_RETURN_IF_ERROR(record(*a));
  return refilled;
}

Result<AllocationInfo> AddressSpace::find_replica(Gva home) const {
  std::shared_lock lock(m_mutex);
  for (const auto& [first, a] : m_allocations) {
    (void)first;
    const Gva& of = a.policy.replica_of;
    if (of.node == home.node && of.node != 0 && home.offset >= of.offset &&
        (home.generation == 0 || home.generation == of.generation)) {
      // The copy is as large as its allocation: `home` lies inside when it
      // lies inside the copy's size from the allocation's base.
      if (home.offset - of.offset < a.size) return info_of(a);
    }
  }
  return Status(ErrorCode::not_found, "node " + std::to_string(m_node) + " holds no copy of " + home.to_string());
}

std::vector<AllocationInfo> AddressSpace::replicated() const {
  std::shared_lock lock(m_mutex);
  std::vector<AllocationInfo> out;
  for (const auto& [first, a] : m_allocations) {
    (void)first;
    if (a.policy.has_copies() || a.policy.is_copy()) out.push_back(info_of(a));
  }
  return out;
}

}  // namespace tiermem
