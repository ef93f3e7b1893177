// MetadataStore on a PMDK libpmemobj pool. The root object holds the
// geometry, the counters and three tables, each one object made when the
// pool is: allocation slots (fixed size, with a separate object for the
// runs of each), domains, and per tier a word per frame saying to whom it is
// lent. A change writes what it touches under pmemobj_tx_add_range and
// commits; the slot of a first page and the free slots are kept in memory,
// rebuilt at open.
#include <libpmemobj.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "mapping/lock_holder.hpp"
#include "mapping/metadata_store.hpp"

namespace tiermem {
namespace {

constexpr const char* k_layout_name = "tiermem-metadata";
constexpr uint64_t k_magic = 0x3130'4154'454d'4d54;  // "TMMETA01"
constexpr uint64_t k_layout = 1;

struct PRun {
  uint64_t frame_offset;
  uint64_t pages;
  uint16_t node;
  uint8_t tier;
  uint8_t flags;
  uint32_t reserved;
  uint64_t memory_generation;
};

struct PSlot {
  uint64_t used;
  uint64_t first_page;
  uint64_t pages;
  uint64_t size;
  uint32_t generation;
  uint8_t tier;
  uint8_t coherent;
  uint16_t reserved;
  uint32_t owner_uid;
  uint32_t name_bytes;
  uint64_t created_unix_ms;
  uint64_t lost_pages;
  uint64_t torn_pages;
  char tenant[64];
  char name[256];
  PMEMoid runs;
  uint64_t run_count;
};

// Beside slot i of the slots table: the copies of that allocation, or what
// it copies.
struct PReplicaEntry {
  uint16_t node;
  uint8_t state;
  uint8_t reserved;
  uint32_t generation;
  uint64_t offset;
};
struct PReplicas {
  uint32_t wanted;
  uint8_t ready;
  uint8_t count;
  uint16_t of_node;
  uint32_t of_generation;
  uint32_t qos;  // QosClass (this table came after the slots; it holds what they lack)
  uint64_t of_offset;
  PReplicaEntry copies[k_max_replicas];
};

// Beside slot i too: whether it is a slab or a sub-page allocation (M10),
// and flags of its policy.
constexpr uint8_t k_record_demotable = 1;
struct PSubPage {
  uint8_t kind;  // RecordKind
  uint8_t flags;  // k_record_demotable (this byte was reserved, 0, before)
  uint8_t reserved[2];
  uint32_t slot_bytes;
  uint64_t page_offset;
};

struct PDomain {
  uint64_t assigned;
  char tenant[64];
  uint64_t limit_pages[4];
};

struct PLent {
  uint32_t borrower;  // 0: not lent
  uint32_t domain;
};

struct Root {
  uint64_t magic;
  uint64_t layout;
  uint64_t node;
  uint64_t page_size;
  uint64_t domains;
  uint64_t pages_per_domain;
  uint64_t tier_frames[4];
  uint64_t next_generation;
  uint64_t memory_generation;
  uint64_t starts;
  uint64_t max_allocations;
  PMEMoid slots;
  PMEMoid domain_table;
  PMEMoid lent[4];
  PMEMoid replicas;  // PReplicas[max_allocations], beside the slots (a pool made before has none yet)
  PMEMoid sub_pages;  // PSubPage[max_allocations], likewise
  // uint64_t[domains]: each domain's memory generation (a pool made before
  // has the node's one, memory_generation above, for every domain).
  PMEMoid domain_generations;
};

Status pool_error(const std::string& what) {
  return Status(ErrorCode::io_error, what + ": " + pmemobj_errormsg());
}

void copy_text(char* dst, size_t room, const std::string& s) {
  std::memset(dst, 0, room);
  std::memcpy(dst, s.data(), std::min(s.size(), room - 1));
}

Gva gva_of(uint16_t node, uint32_t generation, uint64_t offset) {
  Gva g;
  g.node = static_cast<NodeId>(node);
  g.generation = generation;
  g.offset = offset;
  return g;
}

std::string text_of(const char* s, size_t room) { return std::string(s, strnlen(s, room)); }

// One transaction: begun at construction, committed by commit(); whatever
// failed on the way aborts it (the pool is left as before).
class Tx {
 public:
  explicit Tx(PMEMobjpool* pool) : m_ok(pmemobj_tx_begin(pool, nullptr, TX_PARAM_NONE) == 0) {}
  ~Tx() {
    if (!m_ended) {
      if (pmemobj_tx_stage() == TX_STAGE_WORK) pmemobj_tx_abort(ECANCELED);
      (void)pmemobj_tx_end();
    }
  }
  Tx(const Tx&) = delete;
  Tx& operator=(const Tx&) = delete;

  bool add(void* p, size_t n) {
    if (m_ok && pmemobj_tx_add_range_direct(p, n) != 0) m_ok = false;
    return m_ok;
  }
  PMEMoid alloc(size_t n) {
    if (!m_ok) return OID_NULL;
    PMEMoid oid = pmemobj_tx_zalloc(n, 1);
    if (OID_IS_NULL(oid)) m_ok = false;
    return oid;
  }
  void free(PMEMoid oid) {
    if (m_ok && !OID_IS_NULL(oid) && pmemobj_tx_free(oid) != 0) m_ok = false;
  }
  Status commit(const std::string& what) {
    if (m_ok && pmemobj_tx_stage() == TX_STAGE_WORK) {
      pmemobj_tx_commit();
    } else if (pmemobj_tx_stage() == TX_STAGE_WORK) {
      pmemobj_tx_abort(EIO);
    }
    const int rc = pmemobj_tx_end();
    m_ended = true;
    if (!m_ok || rc != 0) return pool_error("recording " + what + " in the metadata pool");
    return Status();
  }

 private:
  bool m_ok;
  bool m_ended = false;
};

class PmemMetadata final : public MetadataStore {
 public:
  PmemMetadata(PMEMobjpool* pool, std::string path) : m_pool(pool), m_path(std::move(path)) {}
  ~PmemMetadata() override { pmemobj_close(m_pool); }

  Status open(const MetadataOptions& o, const MetadataGeometry& g);

  const MetadataImage& image() const override { return m_image; }
  std::string describe() const override { return m_path; }

  Status put_domain(const DomainRecord& d) override {
    if (d.domain >= m_root->domains) return Status(ErrorCode::internal, "domain out of the pool's range");
    PDomain* p = domains() + d.domain;
    Tx tx(m_pool);
    if (tx.add(p, sizeof *p)) {
      p->assigned = 1;
      copy_text(p->tenant, sizeof p->tenant, d.tenant);
      for (size_t i = 0; i < 4; ++i) p->limit_pages[i] = d.limit_pages[i];
    }
    return tx.commit("domain " + std::to_string(d.domain));
  }

  Status put_allocation(const AllocationRecord& a, uint32_t next_generation) override;
  Status erase_allocation(uint64_t first_page, uint64_t page_offset, RecordKind kind) override;

  Status set_lent(Tier tier, const std::vector<uint64_t>& frames, NodeId borrower, uint32_t domain) override {
    const auto t = static_cast<size_t>(tier);
    if (t >= 4 || OID_IS_NULL(m_root->lent[t])) return Status(ErrorCode::internal, "no lent table for the tier");
    auto* table = static_cast<PLent*>(pmemobj_direct(m_root->lent[t]));
    Tx tx(m_pool);
    for (uint64_t f : frames) {
      if (f >= m_root->tier_frames[t]) return Status(ErrorCode::internal, "frame out of the pool's range");
      if (!tx.add(table + f, sizeof(PLent))) break;
      table[f] = {borrower, domain};
    }
    return tx.commit("frames lent to node " + std::to_string(borrower));
  }

  Status set_memory_generations(const std::vector<uint64_t>& generations) override {
    if (generations.size() != m_root->domains) return Status(ErrorCode::internal, "not one generation per domain");
    uint64_t* table = domain_generations();
    Tx tx(m_pool);
    if (tx.add(table, generations.size() * sizeof(uint64_t))) {
      std::copy(generations.begin(), generations.end(), table);
    }
    TIERMEM_RETURN_IF_ERROR(tx.commit("the memory generations of the domains"));
    m_image.memory_generations = generations;
    return Status();
  }

 private:
  PSlot* slots() const { return static_cast<PSlot*>(pmemobj_direct(m_root->slots)); }
  PDomain* domains() const { return static_cast<PDomain*>(pmemobj_direct(m_root->domain_table)); }
  PReplicas* replicas() const { return static_cast<PReplicas*>(pmemobj_direct(m_root->replicas)); }
  PSubPage* sub_pages() const { return static_cast<PSubPage*>(pmemobj_direct(m_root->sub_pages)); }
  uint64_t* domain_generations() const { return static_cast<uint64_t*>(pmemobj_direct(m_root->domain_generations)); }
  // The domains' generation table, made at open in a pool made before it
  // (every domain then had the node's generation).
  Status add_domain_generations();
  // A table beside the slots, made at open in a pool made before it.
  Status add_side_table(PMEMoid* table, size_t entry_bytes, const char* what);
  // Where a record is: first page, offset in it, kind.
  using Place = std::tuple<uint64_t, uint64_t, uint8_t>;
  static Place place_of(uint64_t first_page, uint64_t page_offset, RecordKind kind) {
    return {first_page, page_offset, static_cast<uint8_t>(kind)};
  }
  Status initialize(const MetadataOptions& o, const MetadataGeometry& g);
  Status check_geometry(const MetadataGeometry& g) const;
  void load();

  PMEMobjpool* m_pool;
  std::string m_path;
  Root* m_root = nullptr;
  MetadataImage m_image;
  std::map<Place, size_t> m_slot_of;  // where -> slot
  std::vector<size_t> m_free_slots;
};

Status PmemMetadata::initialize(const MetadataOptions& o, const MetadataGeometry& g) {
  Tx tx(m_pool);
  if (tx.add(m_root, sizeof *m_root)) {
    std::memset(m_root, 0, sizeof *m_root);
    m_root->layout = k_layout;
    m_root->node = g.node;
    m_root->page_size = g.page_size;
    m_root->domains = g.domains;
    m_root->pages_per_domain = g.pages_per_domain;
    m_root->max_allocations = o.max_allocations;
    m_root->slots = tx.alloc(o.max_allocations * sizeof(PSlot));
    m_root->domain_table = tx.alloc(g.domains * sizeof(PDomain));
    m_root->replicas = tx.alloc(o.max_allocations * sizeof(PReplicas));
    m_root->sub_pages = tx.alloc(o.max_allocations * sizeof(PSubPage));
    m_root->domain_generations = tx.alloc(g.domains * sizeof(uint64_t));
    for (size_t t = 0; t < 4; ++t) {
      m_root->tier_frames[t] = g.tier_frames[t];
      if (g.tier_frames[t] > 0) m_root->lent[t] = tx.alloc(g.tier_frames[t] * sizeof(PLent));
    }
    m_root->magic = k_magic;
  }
  return tx.commit("a new metadata pool (" + std::to_string(o.max_allocations) + " allocation slots)");
}

Status PmemMetadata::check_geometry(const MetadataGeometry& g) const {
  const auto differs = [&](const char* what, uint64_t pool, uint64_t now) -> Status {
    return Status(ErrorCode::config_error,
                  "the metadata pool " + m_path + " was made for " + what + " " + std::to_string(pool) +
                      ", the configuration says " + std::to_string(now) +
                      ": restore the configuration it was made with, or move the pool away (its allocations "
                      "are then lost)");
  };
  if (m_root->layout != k_layout) return differs("layout", m_root->layout, k_layout);
  if (m_root->node != g.node) return differs("node", m_root->node, g.node);
  if (m_root->page_size != g.page_size) return differs("page size", m_root->page_size, g.page_size);
  if (m_root->domains != g.domains) return differs("tenants.max_per_node", m_root->domains, g.domains);
  if (m_root->pages_per_domain != g.pages_per_domain) {
    return differs("pages per tenant", m_root->pages_per_domain, g.pages_per_domain);
  }
  for (size_t t = 0; t < 4; ++t) {
    if (m_root->tier_frames[t] != g.tier_frames[t]) {
      return differs((std::string(tier_name(static_cast<Tier>(t))) + " frame numbers (its capacity per page)").c_str(),
                     m_root->tier_frames[t], g.tier_frames[t]);
    }
  }
  return Status();
}

void PmemMetadata::load() {
  m_image.next_generation = static_cast<uint32_t>(m_root->next_generation);
  const uint64_t* generations = domain_generations();
  m_image.memory_generations.assign(generations, generations + m_root->domains);
  m_image.starts = m_root->starts;
  const PDomain* d = domains();
  for (uint32_t k = 0; k < m_root->domains; ++k) {
    if (d[k].assigned == 0) continue;
    DomainRecord r;
    r.domain = k;
    r.tenant = text_of(d[k].tenant, sizeof d[k].tenant);
    for (size_t i = 0; i < 4; ++i) r.limit_pages[i] = d[k].limit_pages[i];
    m_image.domains.push_back(std::move(r));
  }
  const PSlot* s = slots();
  for (size_t i = m_root->max_allocations; i-- > 0;) {
    if (s[i].used == 0) {
      m_free_slots.push_back(i);
      continue;
    }
    AllocationRecord a;
    a.first_page = s[i].first_page;
    a.pages = s[i].pages;
    a.size = s[i].size;
    a.generation = s[i].generation;
    a.tier = static_cast<Tier>(s[i].tier);
    a.coherent = s[i].coherent != 0;
    a.owner_uid = s[i].owner_uid;
    a.created_unix_ms = s[i].created_unix_ms;
    a.lost_pages = s[i].lost_pages;
    a.torn_pages = s[i].torn_pages;
    a.tenant = text_of(s[i].tenant, sizeof s[i].tenant);
    a.name = std::string(s[i].name, std::min<size_t>(s[i].name_bytes, sizeof s[i].name));
    const auto* runs = static_cast<const PRun*>(pmemobj_direct(s[i].runs));
    for (uint64_t k = 0; runs != nullptr && k < s[i].run_count; ++k) {
      a.runs.push_back({runs[k].frame_offset, runs[k].pages, runs[k].node, static_cast<Tier>(runs[k].tier),
                        runs[k].flags, runs[k].memory_generation});
    }
    const PReplicas& r = replicas()[i];
    a.policy.replicas_wanted = r.wanted;
    a.policy.replica_ready = r.ready != 0;
    a.policy.qos = r.qos <= static_cast<uint32_t>(QosClass::graceful_degrade) ? static_cast<QosClass>(r.qos)
                                                                       : QosClass::standard;
    a.policy.replica_of = gva_of(r.of_node, r.of_generation, r.of_offset);
    for (size_t k = 0; k < std::min<size_t>(r.count, k_max_replicas); ++k) {
      const PReplicaEntry& e = r.copies[k];
      a.policy.replicas.push_back({static_cast<NodeId>(e.node), gva_of(e.node, e.generation, e.offset),
                            e.state == 0 ? ReplicaState::in_sync : ReplicaState::dropped});
    }
    const PSubPage& sp = sub_pages()[i];
    a.policy.demotable = (sp.flags & k_record_demotable) != 0;
    if (sp.kind == static_cast<uint8_t>(RecordKind::slab) || sp.kind == static_cast<uint8_t>(RecordKind::sub)) {
      a.kind = static_cast<RecordKind>(sp.kind);
      a.slot_bytes = sp.slot_bytes;
      a.page_offset = sp.page_offset;
    }
    m_slot_of[place_of(a.first_page, a.page_offset, a.kind)] = i;
    m_image.allocations.push_back(std::move(a));
  }
  // In address order, a slab before the allocations in it.
  std::sort(m_image.allocations.begin(), m_image.allocations.end(),
            [](const AllocationRecord& x, const AllocationRecord& y) {
              const auto order = [](RecordKind k) { return k == RecordKind::sub ? 1 : 0; };
              return std::tuple(x.first_page, order(x.kind), x.page_offset) <
                     std::tuple(y.first_page, order(y.kind), y.page_offset);
            });
  for (size_t t = 0; t < 4; ++t) {
    const auto* table = static_cast<const PLent*>(pmemobj_direct(m_root->lent[t]));
    for (uint64_t f = 0; table != nullptr && f < m_root->tier_frames[t]; ++f) {
      if (table[f].borrower != 0) {
        m_image.lent.push_back({static_cast<Tier>(t), f, static_cast<NodeId>(table[f].borrower), table[f].domain});
      }
    }
  }
}

Status PmemMetadata::add_side_table(PMEMoid* table, size_t entry_bytes, const char* what) {
  if (!OID_IS_NULL(*table)) return Status();
  Tx tx(m_pool);
  if (tx.add(table, sizeof *table)) *table = tx.alloc(m_root->max_allocations * entry_bytes);
  return tx.commit(what);
}

Status PmemMetadata::add_domain_generations() {
  if (!OID_IS_NULL(m_root->domain_generations)) return Status();
  Tx tx(m_pool);
  if (tx.add(&m_root->domain_generations, sizeof m_root->domain_generations)) {
    m_root->domain_generations = tx.alloc(m_root->domains * sizeof(uint64_t));
    if (auto* table = static_cast<uint64_t*>(pmemobj_direct(m_root->domain_generations))) {
      std::fill(table, table + m_root->domains, m_root->memory_generation);
    }
  }
  return tx.commit("the domains' memory generation table");
}

Status PmemMetadata::open(const MetadataOptions& o, const MetadataGeometry& g) {
  PMEMoid root = pmemobj_root(m_pool, sizeof(Root));
  if (OID_IS_NULL(root)) return pool_error("the root of metadata pool " + m_path);
  m_root = static_cast<Root*>(pmemobj_direct(root));
  // A pool whose first transaction never committed has no magic yet.
  if (m_root->magic != k_magic) {
    if (m_root->magic != 0) {
      return Status(ErrorCode::io_error, "metadata pool " + m_path + " is not tiermem's (bad magic)");
    }
    TIERMEM_RETURN_IF_ERROR(initialize(o, g));
    m_image.created = true;
  }
  TIERMEM_RETURN_IF_ERROR(check_geometry(g));
  if (OID_IS_NULL(m_root->slots) || OID_IS_NULL(m_root->domain_table)) {
    return Status(ErrorCode::io_error, "metadata pool " + m_path + " lacks its tables");
  }
  // Made before replication or sub-page allocations: its root grew (zeros)
  // above; the tables now.
  TIERMEM_RETURN_IF_ERROR(add_side_table(&m_root->replicas, sizeof(PReplicas), "the replica table"));
  TIERMEM_RETURN_IF_ERROR(add_side_table(&m_root->sub_pages, sizeof(PSubPage), "the sub-page table"));
  TIERMEM_RETURN_IF_ERROR(add_domain_generations());
  {
    Tx tx(m_pool);
    if (tx.add(&m_root->starts, sizeof m_root->starts)) ++m_root->starts;
    TIERMEM_RETURN_IF_ERROR(tx.commit("the start count"));
  }
  load();
  return Status();
}

Status PmemMetadata::put_allocation(const AllocationRecord& a, uint32_t next_generation) {
  size_t slot = 0;
  bool fresh = false;
  const Place place = place_of(a.first_page, a.page_offset, a.kind);
  if (auto it = m_slot_of.find(place); it != m_slot_of.end()) {
    slot = it->second;
  } else if (!m_free_slots.empty()) {
    slot = m_free_slots.back();
    fresh = true;
  } else {
    return Status(ErrorCode::tier_exhausted,
                  "the metadata pool " + m_path + " holds " + std::to_string(m_root->max_allocations) +
                      " allocations, its most (metadata.max_allocations); free some first");
  }
  PSlot* s = slots() + slot;
  Tx tx(m_pool);
  if (tx.add(s, sizeof *s) && tx.add(&m_root->next_generation, sizeof m_root->next_generation)) {
    tx.free(s->runs);
    s->runs = tx.alloc(std::max<size_t>(a.runs.size(), 1) * sizeof(PRun));
    if (auto* runs = static_cast<PRun*>(pmemobj_direct(s->runs))) {
      for (size_t k = 0; k < a.runs.size(); ++k) {
        const RunRecord& r = a.runs[k];
        runs[k] = {r.frame_offset,       r.pages, static_cast<uint16_t>(r.node), static_cast<uint8_t>(r.tier),
                   r.flags,              0,       r.memory_generation};
      }
    }
    s->run_count = a.runs.size();
    s->first_page = a.first_page;
    s->pages = a.pages;
    s->size = a.size;
    s->generation = a.generation;
    s->tier = static_cast<uint8_t>(a.tier);
    s->coherent = a.coherent ? 1 : 0;
    s->owner_uid = a.owner_uid;
    s->created_unix_ms = a.created_unix_ms;
    s->lost_pages = a.lost_pages;
    s->torn_pages = a.torn_pages;
    copy_text(s->tenant, sizeof s->tenant, a.tenant);
    std::memset(s->name, 0, sizeof s->name);
    std::memcpy(s->name, a.name.data(), std::min(a.name.size(), sizeof s->name));
    s->name_bytes = static_cast<uint32_t>(std::min(a.name.size(), sizeof s->name));
    s->used = 1;
    m_root->next_generation = next_generation;
  }
  PReplicas* r = replicas() + slot;
  if (tx.add(r, sizeof *r)) {
    std::memset(r, 0, sizeof *r);
    r->wanted = a.policy.replicas_wanted;
    r->ready = a.policy.replica_ready ? 1 : 0;
    r->qos = static_cast<uint32_t>(a.policy.qos);
    r->of_node = static_cast<uint16_t>(a.policy.replica_of.node);
    r->of_generation = a.policy.replica_of.generation;
    r->of_offset = a.policy.replica_of.offset;
    r->count = static_cast<uint8_t>(std::min<size_t>(a.policy.replicas.size(), k_max_replicas));
    for (size_t k = 0; k < r->count; ++k) {
      const ReplicaInfo& c = a.policy.replicas[k];
      r->copies[k] = {static_cast<uint16_t>(c.node), static_cast<uint8_t>(c.state), 0, c.gva.generation,
                      c.gva.offset};
    }
  }
  PSubPage* sp = sub_pages() + slot;
  if (tx.add(sp, sizeof *sp)) {
    std::memset(sp, 0, sizeof *sp);
    sp->kind = static_cast<uint8_t>(a.kind);
    sp->flags = a.policy.demotable ? k_record_demotable : 0;
    sp->slot_bytes = a.slot_bytes;
    sp->page_offset = a.page_offset;
  }
  TIERMEM_RETURN_IF_ERROR(tx.commit("allocation at page " + std::to_string(a.first_page) +
                                    (a.kind == RecordKind::sub ? " + " + std::to_string(a.page_offset) : "")));
  if (fresh) {
    m_free_slots.pop_back();
    m_slot_of[place] = slot;
  }
  return Status();
}

Status PmemMetadata::erase_allocation(uint64_t first_page, uint64_t page_offset, RecordKind kind) {
  auto it = m_slot_of.find(place_of(first_page, page_offset, kind));
  if (it == m_slot_of.end()) return Status();  // never recorded (a session allocation)
  PSlot* s = slots() + it->second;
  Tx tx(m_pool);
  if (tx.add(s, offsetof(PSlot, name)) && tx.add(&s->runs, sizeof s->runs + sizeof s->run_count)) {
    tx.free(s->runs);
    s->runs = OID_NULL;
    s->run_count = 0;
    s->used = 0;
  }
  TIERMEM_RETURN_IF_ERROR(tx.commit("the free of the allocation at page " + std::to_string(first_page)));
  m_free_slots.push_back(it->second);
  m_slot_of.erase(it);
  return Status();
}

}  // namespace

Result<std::unique_ptr<MetadataStore>> open_pmem_metadata(const MetadataOptions& o, const MetadataGeometry& g) {
  if (o.max_allocations == 0) return Status(ErrorCode::invalid_argument, "metadata.max_allocations must be at least 1");
  std::error_code ec;
  if (!std::filesystem::exists(o.path, ec)) {
    // Made under another name and renamed: a daemon killed while PMDK lays
    // out a new pool leaves no half-made pool at the path.
    uint64_t bytes = o.pool_bytes;
    if (bytes == 0) {
      uint64_t lent = 0;
      for (uint64_t f : g.tier_frames) lent += f * sizeof(PLent);
      bytes = o.max_allocations * (sizeof(PSlot) + sizeof(PReplicas) + sizeof(PSubPage) + 2 * sizeof(PRun) + 128) +
              lent + g.domains * (sizeof(PDomain) + sizeof(uint64_t)) + (16 << 20);
    }
    bytes = std::max<uint64_t>(bytes, PMEMOBJ_MIN_POOL);
    const std::string made = o.path + ".new";
    std::filesystem::remove(made, ec);
    PMEMobjpool* fresh = pmemobj_create(made.c_str(), k_layout_name, bytes, 0600);
    if (fresh == nullptr) return pool_error("creating metadata pool " + made + " of " + format_size(bytes));
    pmemobj_close(fresh);
    std::filesystem::rename(made, o.path, ec);
    if (ec) return Status(ErrorCode::io_error, "renaming " + made + " to " + o.path + ": " + ec.message());
  }
  PMEMobjpool* pool = pmemobj_open(o.path.c_str(), k_layout_name);
  if (pool == nullptr && errno == EWOULDBLOCK) {
    // PMDK flocks a pool it opens: another process has this one open.
    const LockHolder h = flock_holder(o.path);
    const bool ours = h.command.empty() || h.command == "tiermemd";
    return Status(ErrorCode::already_exists,
                  "metadata pool " + o.path + " is in use by another " + (ours ? "tiermemd" : "process") +
                      (h.pid == 0 ? "" : " (pid " + std::to_string(h.pid) + (ours ? "" : ", " + h.command) + ")") +
                      "; two daemons must never share one: give each daemon its own metadata.path (left empty, "
                      "it is metadata.pool in the daemon's own tiers.pmem.path)");
  }
  if (pool == nullptr) return pool_error("opening metadata pool " + o.path);
  auto store = std::make_unique<PmemMetadata>(pool, o.path);
  TIERMEM_RETURN_IF_ERROR(store->open(o, g));
  return std::unique_ptr<MetadataStore>(std::move(store));
}

}  // namespace tiermem
