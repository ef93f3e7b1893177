#include "client/coherent_words.hpp"

#include "pages/version.hpp"

namespace tiermem::detail {

size_t CoherentWords::slot_of(Gva gva, uint64_t page_size) {
  uint64_t h = (gva.offset / page_size) * 0x9E3779B97F4A7C15ull;
  h ^= (uint64_t{gva.node} << 32 | gva.generation) * 0xC2B2AE3D27D4EB4Full;
  return static_cast<size_t>(h >> 58) % k_slots;
}

bool CoherentWords::run(Gva gva, uint64_t page_size, WordOp op, uint64_t operand, uint64_t compare, uint64_t* old,
                        uint8_t* path) const {
  const Route* r = m_slots[slot_of(gva, page_size)].load(std::memory_order_acquire);
  if (r == nullptr) return false;
  if (r->generation != m_generation.load(std::memory_order_acquire) || gva.node != r->base.node ||
      gva.generation != r->base.generation || gva.offset < r->first || gva.offset >= r->end ||
      r->end - gva.offset < 8) {
    return false;
  }
  const uint64_t index = (gva.offset - r->base.offset) / r->page_size;
  if (index >= r->alloc->page_versions.size()) return false;
  uint64_t now = 0;
  if (!r->words->load(r->first_page + index, 1, &now).ok() ||
      version::epoch_of(now) != version::epoch_of(r->alloc->page_versions[index])) {
    return false;  // freed (by anyone) or made anew: the general path translates again
  }
  if (!r->words->check_owner().ok()) return false;
  // Frames that persist are never learnt (a flush that fails after the
  // atomic landed is not to be run again): mapped DRAM fails only before it
  // touches the word (out of its file), which the general path then reports.
  if (!r->frames->atomic(r->frame_first + (gva.offset - r->first), op, operand, compare, old).ok()) return false;
  *path = r->path;
  return true;
}

void CoherentWords::learn(Gva at, Route route) {
  if (route.page_size == 0 || route.frames == nullptr || route.words == nullptr || !route.alloc ||
      route.frames->persistent()) {
    return;
  }
  std::lock_guard lock(m_mutex);
  if (m_routes.size() >= k_most) return;
  route.generation = m_generation.load(std::memory_order_acquire);
  m_routes.push_back(std::make_unique<Route>(std::move(route)));
  const Route* r = m_routes.back().get();
  m_slots[slot_of(at, r->page_size)].store(r, std::memory_order_release);
}

}  // namespace tiermem::detail
