#include "mapping/slab_set.hpp"

#include <bit>

namespace tiermem {
namespace {

bool bit(const std::vector<uint64_t>& bits, uint64_t i) { return (bits[i / 64] >> (i % 64)) & 1; }
void set_bit(std::vector<uint64_t>& bits, uint64_t i, bool on) {
  if (on) {
    bits[i / 64] |= uint64_t{1} << (i % 64);
  } else {
    bits[i / 64] &= ~(uint64_t{1} << (i % 64));
  }
}

}  // namespace

bool SlabSet::Slab::slot_used(uint64_t page_offset) const { return bit(used, page_offset / page.size); }

std::optional<uint64_t> SlabSet::Slab::first_free() const {
  for (size_t w = 0; w < used.size(); ++w) {
    if (~used[w] != 0) return w * 64 + static_cast<uint64_t>(std::countr_one(used[w]));
  }
  return std::nullopt;
}

bool SlabSet::Slab::slot_dirty(uint64_t index) const { return bit(dirty, index); }

void SlabSet::Slab::clear_dirty(uint64_t index) { set_bit(dirty, index, false); }

void SlabSet::Slab::dirty_free_slots() {
  for (uint64_t i = 0; i < slots; ++i) {
    if (!bit(used, i)) set_bit(dirty, i, true);
  }
}

SlabSet::Slab SlabSet::empty(uint64_t slot_bytes) const {
  Slab slab;
  slab.slots = static_cast<uint32_t>(m_page_size / slot_bytes);
  slab.used.assign((slab.slots + 63) / 64, 0);
  slab.dirty.assign(slab.used.size(), 0);
  for (uint64_t i = slab.slots; i < slab.used.size() * 64; ++i) set_bit(slab.used, i, true);  // no such slots
  return slab;
}

SlabSet::Kind SlabSet::kind_of(const Slab& slab) const {
  return {static_cast<uint32_t>(slab.page.first_page / m_pages_per_domain), static_cast<uint8_t>(slab.page.tier),
          static_cast<uint32_t>(slab.page.size), slab.page.coherent};
}

SlabSet::Slab& SlabSet::add(Slab slab, bool open) {
  const uint64_t page = slab.page.first_page;
  Slab& kept = m_slabs.try_emplace(page, std::move(slab)).first->second;
  if (open) m_open[kind_of(kept)].insert(page);
  return kept;
}

void SlabSet::remove(uint64_t page) {
  auto it = m_slabs.find(page);
  if (it == m_slabs.end()) return;
  m_open[kind_of(it->second)].erase(page);
  m_slabs.erase(it);
}

SlabSet::Slab* SlabSet::find(uint64_t page) {
  auto it = m_slabs.find(page);
  return it == m_slabs.end() ? nullptr : &it->second;
}

const SlabSet::Slab* SlabSet::find(uint64_t page) const {
  auto it = m_slabs.find(page);
  return it == m_slabs.end() ? nullptr : &it->second;
}

SlabSet::Slab* SlabSet::open_slab(uint32_t domain, Tier tier, uint32_t slot_bytes, bool coherent) {
  auto open = m_open.find({domain, static_cast<uint8_t>(tier), slot_bytes, coherent});
  if (open == m_open.end() || open->second.empty()) return nullptr;
  return &m_slabs.at(*open->second.begin());
}

void SlabSet::set_open(const Slab& slab, bool open) {
  if (open) {
    m_open[kind_of(slab)].insert(slab.page.first_page);
  } else {
    m_open[kind_of(slab)].erase(slab.page.first_page);
  }
}

void SlabSet::mark(Slab& slab, uint64_t page_offset, bool used, bool usable) {
  const uint64_t i = page_offset / slab.page.size;
  set_bit(slab.used, i, used);
  if (used) {
    ++slab.in_use;
  } else {
    --slab.in_use;
    set_bit(slab.dirty, i, true);  // zeroed when taken again
  }
  std::set<uint64_t>& open = m_open[kind_of(slab)];
  if (slab.in_use < slab.slots && usable) {
    open.insert(slab.page.first_page);
  } else {
    open.erase(slab.page.first_page);
  }
}

uint64_t SlabSet::allocations() const {
  uint64_t n = 0;
  for (const auto& [page, slab] : m_slabs) n += slab.in_use;
  return n;
}

std::vector<uint64_t> SlabSet::pages() const {
  std::vector<uint64_t> out;
  out.reserve(m_slabs.size());
  for (const auto& [page, slab] : m_slabs) out.push_back(page);
  return out;
}

}  // namespace tiermem
