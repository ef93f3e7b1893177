// The tenants' domains of one address space (O5): each a slice of the
// node's virtual pages and, per tier, the frames of the tenant's own files,
// with the tenant's quota and what it uses of it; and which tenant holds
// which domain. The AddressSpace opens the files and takes the frames
// (tiers and metadata are its); this keeps who holds what. Not thread-safe:
// the AddressSpace's lock guards it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tiermem/types.h>

#include "mapping/extent_set.hpp"

namespace tiermem {

class DomainTable {
 public:
  // A tenant's slice of the node: virtual pages and, per tier, free frames.
  struct Domain {
    std::string tenant;
    bool assigned = false;
    ExtentSet virtual_pages;
    uint64_t cursor = 0;                   // next-fit start in virtual_pages
    std::array<ExtentSet, 4> free_frames;  // DRAM, PMEM: frames of its files (global numbers)
    std::array<uint64_t, 4> used{};        // pages in use, per tier (quota)
    std::array<uint64_t, 4> limit{};       // pages allowed, per tier
  };

  // `count` domains of `pages_per_domain` virtual pages each; page 0 stays
  // unallocated (GVA offset 0 is null).
  DomainTable(uint32_t count, uint64_t pages_per_domain);

  uint32_t size() const { return static_cast<uint32_t>(m_domains.size()); }
  Domain& at(uint32_t domain) { return m_domains[domain]; }
  const Domain& at(uint32_t domain) const { return m_domains[domain]; }
  // The domain of `tenant`, if it has one.
  std::optional<uint32_t> find(const std::string& tenant) const;
  // A domain no tenant holds yet.
  std::optional<uint32_t> unassigned() const;
  // `tenant` holds `domain` from now on (its files are open).
  void assign(uint32_t domain, const std::string& tenant);
  // The tenant holding a domain ("" while unassigned, or out of range).
  std::string tenant_of(uint32_t domain) const;
  // Pages of `tier` a tenant uses (0 without a domain).
  uint64_t used_pages(const std::string& tenant, Tier tier) const;

 private:
  std::vector<Domain> m_domains;
  std::map<std::string, uint32_t> m_of;  // tenant -> domain
};

}  // namespace tiermem
