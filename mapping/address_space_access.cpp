// AddressSpace: finding allocations, translation, data copies and pinning.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "mapping/address_space.hpp"
#include "mapping/version.hpp"

namespace tiermem {
namespace {

constexpr auto k_page_lock_timeout = std::chrono::seconds(2);

Status busy_page(Gva gva, uint64_t page) {
  return Status(ErrorCode::busy, "page " + std::to_string(page) + " holding " + gva.to_string() +
                                     " stayed locked by another writer for " +
                                     std::to_string(k_page_lock_timeout.count()) +
                                     " s (a client may have stopped mid-write)");
}

}  // namespace

Status AddressSpace::not_allocated_error(Gva gva) const {
  const uint64_t page = gva.offset >> m_table.page_shift();
  const PageEntry* e = m_table.find(page);
  std::string why;
  if (page >= m_table.pages()) {
    why = "beyond node " + std::to_string(m_node) + "'s address range";
  } else if (e != nullptr && e->generation != 0) {
    why = "freed at generation " + std::to_string(e->generation);
  } else {
    why = "never allocated";
  }
  return Status(ErrorCode::not_allocated, "GVA " + gva.to_string() + " is not allocated (" + why + ")");
}

Result<const AddressSpace::Allocation*> AddressSpace::locate(Gva gva) const {
  if (gva.node != m_node) {
    return Status(ErrorCode::bad_gva, "GVA " + gva.to_string() + " belongs to node " +
                                          std::to_string(gva.node) + ", not to node " +
                                          std::to_string(m_node));
  }
  const uint64_t page = gva.offset >> m_table.page_shift();
  const PageEntry* e = m_table.find(page);
  if (e == nullptr || !e->present()) return not_allocated_error(gva);
  auto it = m_allocations.upper_bound(page);
  if (it == m_allocations.begin()) return Status(ErrorCode::internal, "page table and allocations disagree");
  --it;
  const Allocation& a = it->second;
  if (gva.generation != 0 && gva.generation != a.generation) {
    return Status(ErrorCode::stale_generation,
                  "GVA " + gva.to_string() + " is of generation " + std::to_string(gva.generation) +
                      ", but the allocation there now is of generation " +
                      std::to_string(a.generation) + " (the old one was freed)");
  }
  return &a;
}

Result<const AddressSpace::Allocation*> AddressSpace::locate_range(Gva gva, size_t length,
                                                                   const char* op) const {
  auto located = locate(gva);
  if (!located.ok()) return located;
  const Allocation& a = **located;
  const uint64_t into = gva.offset - a.first_page * page_size();
  if (into > a.size || length > a.size - into) {
    return Status(ErrorCode::out_of_range,
                  std::string(op) + " of " + std::to_string(length) + " bytes at " +
                      gva.to_string() + " (offset " + std::to_string(into) +
                      ") runs past the end of allocation " + info_of(a).gva.to_string() + " of " +
                      std::to_string(a.size) + " bytes");
  }
  return located;
}

std::vector<Extent> AddressSpace::extents_of(const Allocation& a) const {
  std::vector<Extent> out;
  uint64_t gva_offset = 0;
  for (const UnitRange& f : a.frames) {
    Extent x;
    x.tier = a.tier;
    x.node = m_node;
    x.frame_offset = f.start * page_size();
    x.gva_offset = gva_offset;
    x.length = f.count * page_size();
    gva_offset += x.length;
    out.push_back(x);
  }
  return out;
}

AllocationLayout AddressSpace::layout_of(const Allocation& a) const {
  AllocationLayout layout;
  layout.info = info_of(a);
  layout.first_page = a.first_page;
  layout.extents = extents_of(a);
  layout.page_versions.reserve(a.pages);
  auto& versions = const_cast<VersionArray&>(m_versions);
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    layout.page_versions.push_back(version::load(versions.word(p)));
  }
  return layout;
}

Result<AllocationLayout> AddressSpace::layout(Gva gva) const {
  std::shared_lock lock(m_mutex);
  auto located = locate(gva);
  if (!located.ok()) return located.status();
  return layout_of(**located);
}

PageInfo AddressSpace::page_info(uint64_t page) const {
  PageInfo p;
  p.page_index = page;
  if (const PageEntry* e = m_table.find(page)) {
    p.tier = e->tier;
    p.node = e->node;
    p.frame_offset = e->frame_offset;
    p.flags = e->page_flags();
  }
  p.version = version::load(const_cast<VersionArray&>(m_versions).word(page));
  const SubBlockBits bits = m_table.sub_blocks(page);
  p.valid_mask = bits.valid;
  p.dirty_mask = bits.dirty;
  return p;
}

Result<Translation> AddressSpace::translate(Gva gva) const {
  std::shared_lock lock(m_mutex);
  auto located = locate(gva);
  if (!located.ok()) return located.status();
  const Allocation& a = **located;
  Translation t;
  t.allocation = info_of(a);
  t.offset_in_allocation = gva.offset - t.allocation.gva.offset;
  t.page = page_info(gva.offset >> m_table.page_shift());
  t.extents = extents_of(a);
  return t;
}

Status AddressSpace::write(Gva gva, const void* src, size_t length) {
  std::shared_lock lock(m_mutex);
  auto located = locate_range(gva, length, "write");
  if (!located.ok()) return located.status();
  const uint64_t psize = page_size();
  const auto* in = static_cast<const std::byte*>(src);
  uint64_t offset = gva.offset;
  while (length > 0) {
    const uint64_t page = offset >> m_table.page_shift();
    const uint64_t in_page = offset & (psize - 1);
    const size_t n = std::min<uint64_t>(length, psize - in_page);
    const PageEntry e = *m_table.find(page);
    uint64_t& word = m_versions.word(page);
    uint64_t locked = 0;
    if (!version::lock_for(word, k_page_lock_timeout, &locked)) return busy_page(gva, page);
    Status s = backend(e.tier)->write(e.frame_offset + in_page, in, n);
    // The page lock orders writers of this page, so its L3 bits are ours.
    if (s.ok()) m_table.mark_written(page, in_page, n, backend(e.tier)->persistent());
    version::unlock(word, locked);
    if (!s.ok()) return s.with_context("write to " + gva.to_string());
    in += n;
    offset += n;
    length -= n;
  }
  return Status();
}

Status AddressSpace::read(Gva gva, void* dst, size_t length) {
  std::shared_lock lock(m_mutex);
  auto located = locate_range(gva, length, "read");
  if (!located.ok()) return located.status();
  const uint64_t psize = page_size();
  auto* out = static_cast<std::byte*>(dst);
  uint64_t offset = gva.offset;
  while (length > 0) {
    const uint64_t page = offset >> m_table.page_shift();
    const uint64_t in_page = offset & (psize - 1);
    const size_t n = std::min<uint64_t>(length, psize - in_page);
    const PageEntry e = *m_table.find(page);
    uint64_t& word = m_versions.word(page);
    for (;;) {
      uint64_t start = 0;
      if (!version::read_begin_for(word, k_page_lock_timeout, &start)) return busy_page(gva, page);
      Status s = backend(e.tier)->read(e.frame_offset + in_page, out, n);
      if (!s.ok()) return s.with_context("read of " + gva.to_string());
      if (version::read_validate(word, start)) break;  // else a writer got in: copy again
    }
    out += n;
    offset += n;
    length -= n;
  }
  return Status();
}

void AddressSpace::set_pinned(const Allocation& a, bool pinned) {
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    PageEntry e = *m_table.find(p);
    e.flags = pinned ? (e.flags | k_page_pinned) : (e.flags & ~k_page_pinned);
    m_table.set(p, e);
  }
}

Result<AllocationLayout> AddressSpace::pin(Gva gva) {
  std::unique_lock lock(m_mutex);
  auto located = locate(gva);
  if (!located.ok()) return located.status();
  auto& a = const_cast<Allocation&>(**located);
  if (a.map_count++ == 0) set_pinned(a, true);
  return layout_of(a);
}

Status AddressSpace::unpin(Gva gva) {
  std::unique_lock lock(m_mutex);
  auto located = locate(gva);
  if (!located.ok()) return located.status();
  auto& a = const_cast<Allocation&>(**located);
  if (a.map_count == 0) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + info_of(a).gva.to_string() + " is not mapped");
  }
  if (--a.map_count == 0) set_pinned(a, false);
  return Status();
}

}  // namespace tiermem
