#include "mapping/frame_loans.hpp"

#include <algorithm>

namespace tiermem {
namespace {

std::pair<uint8_t, uint64_t> key(Tier tier, uint64_t frame_offset) {
  return {static_cast<uint8_t>(tier), frame_offset};
}

}  // namespace

void FrameLoans::lend(Tier tier, uint64_t frame_offset, NodeId borrower, uint32_t domain) {
  m_loans[key(tier, frame_offset)] = {borrower, domain};
}

std::optional<FrameLoans::Loan> FrameLoans::find(Tier tier, uint64_t frame_offset) const {
  auto it = m_loans.find(key(tier, frame_offset));
  if (it == m_loans.end()) return std::nullopt;
  return it->second;
}

std::optional<FrameLoans::Loan> FrameLoans::settle(Tier tier, uint64_t frame_offset) {
  auto it = m_loans.find(key(tier, frame_offset));
  if (it == m_loans.end()) return std::nullopt;
  const Loan loan = it->second;
  m_loans.erase(it);
  return loan;
}

size_t FrameLoans::lent_to(NodeId borrower) const {
  return static_cast<size_t>(
      std::count_if(m_loans.begin(), m_loans.end(), [&](const auto& e) { return e.second.borrower == borrower; }));
}

uint64_t FrameLoans::lender_generation(NodeId node, const std::string& tenant) const {
  auto it = m_lenders.find({node, tenant});
  return it == m_lenders.end() ? 0 : it->second;
}

void FrameLoans::note(NodeId node, const std::string& tenant, uint64_t generation) {
  m_lenders[{node, tenant}] = generation;
}

void FrameLoans::remember(NodeId node, const std::string& tenant, uint64_t generation) {
  m_lenders.emplace(std::pair(node, tenant), generation);
}

std::set<std::string> FrameLoans::lenders_gone(NodeId node, const std::map<std::string, uint64_t>& generations) {
  std::set<std::string> gone;
  for (auto& [lender, known] : m_lenders) {
    if (lender.first != node) continue;
    auto now = generations.find(lender.second);
    const uint64_t current = now == generations.end() ? 0 : now->second;
    if (current == known) continue;
    known = current;
    gone.insert(lender.second);
  }
  return gone;
}

}  // namespace tiermem
