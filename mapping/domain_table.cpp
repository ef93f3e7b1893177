#include "mapping/domain_table.hpp"

namespace tiermem {

DomainTable::DomainTable(uint32_t count, uint64_t pages_per_domain) : m_domains(count) {
  for (uint32_t d = 0; d < count; ++d) {
    const uint64_t first = d == 0 ? 1 : uint64_t{d} * pages_per_domain;
    m_domains[d].virtual_pages = ExtentSet(first, (uint64_t{d} + 1) * pages_per_domain - first);
    m_domains[d].cursor = first;
  }
}

std::optional<uint32_t> DomainTable::find(const std::string& tenant) const {
  auto it = m_of.find(tenant);
  if (it == m_of.end()) return std::nullopt;
  return it->second;
}

std::optional<uint32_t> DomainTable::unassigned() const {
  for (uint32_t k = 0; k < m_domains.size(); ++k) {
    if (!m_domains[k].assigned) return k;
  }
  return std::nullopt;
}

void DomainTable::assign(uint32_t domain, const std::string& tenant) {
  m_domains[domain].assigned = true;
  m_domains[domain].tenant = tenant;
  m_of.emplace(tenant, domain);
}

std::string DomainTable::tenant_of(uint32_t domain) const {
  return domain < m_domains.size() ? m_domains[domain].tenant : std::string();
}

uint64_t DomainTable::used_pages(const std::string& tenant, Tier tier) const {
  auto it = m_of.find(tenant);
  if (it == m_of.end()) return 0;
  return m_domains[it->second].used[static_cast<size_t>(tier)];
}

}  // namespace tiermem
