// Frames an address space lends and borrows (C3: a page homed on one node
// may live on another's frames).
//   - Loans: frames of this node reserved and not yet in one of its page
//     entries: lent to a page of another node (the borrower), or for a page
//     of this node moving here (borrower = this node); each counts against
//     the quota of the domain it was taken from.
//   - Lenders: for frames other nodes lent to this node's pages, the memory
//     generation of the lender's domain (of the allocation's tenant) they
//     came from: extents on them carry it, and a lender whose domain was
//     made anew since took them with it.
// The AddressSpace reserves, records and frees the frames; this keeps the
// books, under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <tiermem/gva.h>
#include <tiermem/types.h>

namespace tiermem {

class FrameLoans {
 public:
  struct Loan {
    NodeId borrower = 0;
    uint32_t domain = 0;  // whose quota the frame counts against
  };

  // The frame at `frame_offset` of `tier` is lent to `borrower`.
  void lend(Tier tier, uint64_t frame_offset, NodeId borrower, uint32_t domain);
  // The loan of a frame, if it is lent.
  std::optional<Loan> find(Tier tier, uint64_t frame_offset) const;
  // Ends a loan (the frame is given back, or now in one of this node's page
  // entries); returns it.
  std::optional<Loan> settle(Tier tier, uint64_t frame_offset);
  // Frames lent to `borrower` now.
  size_t lent_to(NodeId borrower) const;

  // The memory generation of `tenant`'s domain on `node` as of the frames it
  // lent (0: unknown). note() replaces it; remember() keeps the first.
  uint64_t lender_generation(NodeId node, const std::string& tenant) const;
  void note(NodeId node, const std::string& tenant, uint64_t generation);
  void remember(NodeId node, const std::string& tenant, uint64_t generation);
  // `node`'s domains are now of `generations` (by tenant): the tenants
  // whose domain there lent us frames from memory it no longer has (their
  // generation is updated).
  std::set<std::string> lenders_gone(NodeId node, const std::map<std::string, uint64_t>& generations);

 private:
  std::map<std::pair<uint8_t, uint64_t>, Loan> m_loans;                // (tier, frame offset) -> loan
  std::map<std::pair<NodeId, std::string>, uint64_t> m_lenders;  // (node, tenant) -> generation
};

}  // namespace tiermem
