// AddressSpace: finding allocations, translation, data copies and pinning.
#include <algorithm>
#include <mutex>
#include <optional>

#include <tiermem/status_macros.h>

#include "mapping/address_space.hpp"
#include "pages/version.hpp"

namespace tiermem {
namespace {

// This node's memory directly; other nodes' through `elsewhere`.
class NodeAccess final : public MemoryAccess {
 public:
  NodeAccess(NodeId node, VersionWords& words, std::array<std::optional<BackendFrameData>, 4>& frames,
             MemoryAccess* elsewhere)
      : m_node(node), m_words(words), m_frames(frames), m_elsewhere(elsewhere) {}
  Result<VersionWords*> versions(NodeId home, uint64_t first_page) override {
    if (home == m_node) return &m_words;
    if (m_elsewhere == nullptr) return elsewhere(home);
    return m_elsewhere->versions(home, first_page);
  }
  Result<FrameData*> frames(NodeId node, Tier tier) override {
    if (node != m_node) {
      if (m_elsewhere == nullptr) return elsewhere(node);
      return m_elsewhere->frames(node, tier);
    }
    auto& f = m_frames[static_cast<size_t>(tier)];
    if (!f) return Status(ErrorCode::tier_unavailable, "node " + std::to_string(m_node) + " has no " +
                                                           std::string(tier_name(tier)) + " tier");
    return static_cast<FrameData*>(&*f);
  }

 private:
  static Status elsewhere(NodeId node) {
    return Status(ErrorCode::not_supported, "page is on node " + std::to_string(node));
  }
  NodeId m_node;
  VersionWords& m_words;
  std::array<std::optional<BackendFrameData>, 4>& m_frames;
  MemoryAccess* m_elsewhere;
};

}  // namespace

Status BackendFrameData::read(uint64_t frame_offset, void* dst, size_t length) {
  if (!m_backend.contains(frame_offset, length)) return stale_translation();
  return m_backend.read(frame_offset, dst, length);
}

Status BackendFrameData::write(uint64_t frame_offset, const void* src, size_t length) {
  if (!m_backend.contains(frame_offset, length)) return stale_translation();
  return m_backend.write(frame_offset, src, length);
}

Status BackendFrameData::atomic(uint64_t frame_offset, WordOp op, uint64_t operand,
                                uint64_t compare, uint64_t* old) {
  if (frame_offset % 8 != 0 || !m_backend.contains(frame_offset, 8)) return stale_translation();
  std::byte* base = m_backend.host_base();
  if (base == nullptr) {
    return Status(ErrorCode::not_supported, std::string("atomics on the ") +
                                                std::string(tier_name(m_backend.tier())) +
                                                " tier are not supported");
  }
  *old = host_atomic(base + frame_offset, op, operand, compare);
  if (m_backend.persistent()) return m_backend.persist(frame_offset, 8);
  return Status();
}

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

Result<AddressSpace::Allocation*> AddressSpace::locate(Gva gva) const {
  if (gva.node != m_node) {
    return Status(ErrorCode::bad_gva, "GVA " + gva.to_string() + " belongs to node " +
                                          std::to_string(gva.node) + ", not to node " +
                                          std::to_string(m_node));
  }
  const uint64_t page = gva.offset >> m_table.page_shift();
  const PageEntry* e = m_table.find(page);
  if (e == nullptr || !e->present()) return not_allocated_error(gva);
  auto it = m_allocations.upper_bound(gva.offset);
  const bool shared = m_slabs.contains(page);
  if (it == m_allocations.begin()) {
    if (shared) return not_allocated_error(gva);
    return Status(ErrorCode::internal, "page table and allocations disagree");
  }
  --it;
  auto& a = const_cast<Allocation&>(it->second);
  if (shared && (a.first_page != page || gva.offset - start_of(a) >= a.slot_bytes)) {
    return Status(ErrorCode::not_allocated, "GVA " + gva.to_string() + " is not allocated (a free slot of page " +
                                                std::to_string(page) + ", which small allocations share)");
  }
  if (!shared && (a.slot_bytes != 0 || page >= a.first_page + a.pages)) {
    return Status(ErrorCode::internal, "page table and allocations disagree");
  }
  if (gva.generation != 0 && gva.generation != a.generation) {
    return Status(ErrorCode::stale_generation,
                  "GVA " + gva.to_string() + " is of generation " + std::to_string(gva.generation) +
                      ", but the allocation there now is of generation " +
                      std::to_string(a.generation) + " (the old one was freed)");
  }
  return &a;
}

Result<AddressSpace::Allocation*> AddressSpace::locate_usable(Gva gva) const {
  TIERMEM_ASSIGN_OR_RETURN(Allocation* a, locate(gva));
  if (a->lost_pages == 0) return a;
  return Status(ErrorCode::data_lost, "allocation " + info_of(*a).gva.to_string() + " lost " +
                                          std::to_string(a->lost_pages) +
                                          " page(s): they were on frames of a node whose memory was made anew "
                                          "(it rebooted or its memory was wiped); free it");
}

std::vector<Extent> AddressSpace::extents_of(const Allocation& a) const {
  // Consecutive pages on the same node and tier with consecutive frames form
  // one extent.
  std::vector<Extent> out;
  const uint64_t psize = page_size();
  if (a.slot_bytes != 0) {
    // Its slot of the shared page (never on another node: slabs are not
    // migrated).
    const PageEntry& e = *m_table.find(a.first_page);
    out.push_back({e.tier, e.node, e.frame_offset + a.page_offset, 0, a.slot_bytes, 0});
    return out;
  }
  for (uint64_t i = 0; i < a.pages; ++i) {
    const PageEntry& e = *m_table.find(a.first_page + i);
    if (!out.empty()) {
      Extent& last = out.back();
      if (last.node == e.node && last.tier == e.tier && last.frame_offset + last.length == e.frame_offset) {
        last.length += psize;
        continue;
      }
    }
    out.push_back({e.tier, e.node, e.frame_offset, i * psize, psize, 0});
    if (e.node != m_node) {
      out.back().memory_generation = m_loans.lender_generation(e.node, a.tenant);
    }
  }
  return out;
}

AllocationLayout AddressSpace::layout_of(const Allocation& a) const {
  AllocationLayout layout;
  layout.info = info_of(a);
  layout.first_page = a.first_page;
  layout.extents = extents_of(a);
  layout.coherent = a.coherent;
  layout.page_versions.reserve(a.pages);
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    layout.page_versions.push_back(version::load(m_versions->word(p)));
  }
  return layout;
}

Result<AllocationLayout> AddressSpace::layout(Gva gva) const {
  std::shared_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate_usable(gva));
  return layout_of(*located);
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
  p.version = version::load(m_versions->word(page));
  p.epoch = version::epoch_of(p.version);
  p.sequence = version::sequence_of(p.version) & ~version::k_exclusive_pending;
  p.locked = version::is_locked(p.version);
  p.exclusive_pending = (p.version & version::k_exclusive_pending) != 0;
  const SubBlockBits bits = m_table.sub_blocks(page);
  p.valid_mask = bits.valid;
  p.dirty_mask = bits.dirty;
  return p;
}

Result<Translation> AddressSpace::translate(Gva gva) const {
  std::shared_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate(gva));
  const Allocation& a = *located;
  Translation t;
  t.allocation = info_of(a);
  t.offset_in_allocation = gva.offset - t.allocation.gva.offset;
  t.page = page_info(gva.offset >> m_table.page_shift());
  t.extents = extents_of(a);
  return t;
}

Status AddressSpace::copy(Gva gva, std::byte* buffer, size_t length, bool to_memory,
                          MemoryAccess* elsewhere) {
  NodeAccess access(m_node, m_local_words, m_local_frames, elsewhere);
  // A stale translation (a concurrent migration) is retried with a fresh one,
  // for as long as a page lock may be waited for.
  const auto give_up = std::chrono::steady_clock::now() + 5 * k_page_lock_timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto l, layout(gva));
    const LayoutView view{m_node,     l.first_page,      page_size(), l.info.size, l.extents, l.page_versions,
                          l.info.gva.offset % page_size()};
    const uint64_t offset = gva.offset - l.info.gva.offset;
    Status s = copy_through_layout(view, access, offset, buffer, length, to_memory, k_page_lock_timeout);
    if (s.code() == ErrorCode::out_of_range) {
      return past_the_end(to_memory, length, gva, offset, l.info.gva, l.info.size);
    }
    if (s.ok()) return s;
    if (!is_stale(s)) return s.with_context(std::string(to_memory ? "write to " : "read of ") + gva.to_string());
  }
  return Status(ErrorCode::busy, gva.to_string() + " kept moving; try again");
}

Status AddressSpace::write(Gva gva, const void* src, size_t length, MemoryAccess* elsewhere) {
  return copy(gva, static_cast<std::byte*>(const_cast<void*>(src)), length, true, elsewhere);
}

Status AddressSpace::read(Gva gva, void* dst, size_t length, MemoryAccess* elsewhere) {
  return copy(gva, static_cast<std::byte*>(dst), length, false, elsewhere);
}

Result<uint64_t> AddressSpace::atomic(Gva gva, WordOp op, uint64_t operand, uint64_t compare,
                                      MemoryAccess* elsewhere) {
  if (gva.offset % 8 != 0) {
    return Status(ErrorCode::invalid_argument, "atomics need an 8-byte aligned word; " + gva.to_string() + " is not");
  }
  NodeAccess access(m_node, m_local_words, m_local_frames, elsewhere);
  const auto give_up = std::chrono::steady_clock::now() + 5 * k_page_lock_timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    TIERMEM_ASSIGN_OR_RETURN(auto l, layout(gva));
    const uint64_t offset = gva.offset - l.info.gva.offset;
    if (offset + 8 > l.info.size) {
      return Status(ErrorCode::out_of_range, "word at " + gva.to_string() + " lies past the end of allocation " +
                                                 l.info.gva.to_string() + " of " + std::to_string(l.info.size) + " bytes");
    }
    const Extent* x = nullptr;
    for (const Extent& e : l.extents) {
      if (offset >= e.gva_offset && offset < e.gva_offset + e.length) x = &e;
    }
    TIERMEM_ASSIGN_OR_RETURN(auto frames, access.frames(x->node, x->tier));
    const uint64_t index = offset / page_size();
    uint64_t old = 0;
    Status s = seqlocked_atomic(m_local_words, *frames, l.first_page + index, l.page_versions[index],
                                l.coherent, x->frame_offset + (offset - x->gva_offset), op, operand,
                                compare, &old, k_page_lock_timeout);
    if (s.ok()) return old;
    if (!is_stale(s)) return s.with_context("atomic on " + gva.to_string());
  }
  return Status(ErrorCode::busy, gva.to_string() + " kept moving; try again");
}

Result<FrameData*> AddressSpace::frames(NodeId node, Tier tier, MemoryAccess* elsewhere) {
  NodeAccess access(m_node, m_local_words, m_local_frames, elsewhere);
  return access.frames(node, tier);
}

void AddressSpace::set_pinned(const Allocation& a, bool pinned) {
  if (a.slot_bytes != 0) {
    // The shared page stays pinned while any allocation in it is mapped.
    Allocation& page = m_slabs.find(a.first_page)->page;
    if (pinned ? page.map_count++ != 0 : --page.map_count != 0) return;
    set_pinned(page, pinned);
    return;
  }
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    PageEntry e = *m_table.find(p);
    e.flags = pinned ? (e.flags | k_page_pinned) : (e.flags & ~k_page_pinned);
    m_table.set(p, e);
  }
}

Result<AllocationLayout> AddressSpace::pin(Gva gva) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate_usable(gva));
  Allocation& a = *located;
  if (a.migrating) return Status(ErrorCode::busy, "allocation is being migrated; map it after");
  for (uint64_t p = a.first_page; p < a.first_page + a.pages; ++p) {
    if (m_table.find(p)->node != m_node) {
      return Status(ErrorCode::not_supported,
                    "allocation " + info_of(a).gva.to_string() + " has pages on node " +
                        std::to_string(m_table.find(p)->node) + "; only memory of this node can be mapped");
    }
  }
  if (a.map_count++ == 0) set_pinned(a, true);
  return layout_of(a);
}

Status AddressSpace::unpin(Gva gva) {
  std::unique_lock lock(m_mutex);
  TIERMEM_ASSIGN_OR_RETURN(auto located, locate(gva));
  Allocation& a = *located;
  if (a.map_count == 0) {
    return Status(ErrorCode::failed_precondition,
                  "allocation " + info_of(a).gva.to_string() + " is not mapped");
  }
  if (--a.map_count == 0) set_pinned(a, false);
  return Status();
}

}  // namespace tiermem
