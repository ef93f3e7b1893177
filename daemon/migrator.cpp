#include "daemon/migrator.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/peer_access.hpp"

namespace tiermem {

namespace {

// A run: at most k_run_pages pages and k_run_bytes. The copy engines take a
// run's ranges before one wait, and its frames, locks and record are handled
// once; readers and writers of its pages wait for the whole run.
constexpr uint64_t k_run_pages = 32;
constexpr uint64_t k_run_bytes = 64ull << 20;
// Between nodes pages go one at a time through the daemon (TCP: ~0.5 GB/s):
// shorter runs keep the pages' readers and writers from waiting long.
constexpr uint64_t k_remote_run_bytes = 4ull << 20;

// Ranges of `copies` that continue each other on both sides, as one.
std::vector<FrameCopy> coalesced(std::vector<FrameCopy> copies) {
  std::vector<FrameCopy> out;
  for (const FrameCopy& c : copies) {
    if (!out.empty() && out.back().source_offset + out.back().length == c.source_offset &&
        out.back().offset + out.back().length == c.offset) {
      out.back().length += c.length;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

Result<Migrator::Reserved> Migrator::reserve(NodeId node, Tier tier, uint64_t pages) {
  const uint64_t page = m_space.page_size();
  Reserved r;
  std::vector<Extent> extents;
  if (node == m_space.node()) {
    TIERMEM_ASSIGN_OR_RETURN(extents, m_space.reserve_frames(tier, pages, m_tenant, m_limits, m_space.node()));
  } else {
    Identity who;
    who.tenant = m_tenant;
    TIERMEM_ASSIGN_OR_RETURN(LentFrames lent, m_peers->stub(node, who).reserve_frames(tier, pages));
    extents = std::move(lent.extents);
    r.memory_generation = lent.memory_generation;
    r.incarnation = lent.incarnation;
  }
  // What the lender sent must be `pages` distinct whole frames of the tier:
  // two pages copied into one frame would lose one of them.
  uint64_t total = 0;
  bool as_asked = true;
  std::set<uint64_t> seen;
  for (const Extent& x : extents) {
    as_asked = as_asked && x.node == node && x.tier == tier && x.length > 0 && x.length % page == 0 &&
               x.frame_offset % page == 0 && x.length <= pages * page - total;
    total += as_asked ? x.length : 0;
    for (uint64_t at = 0; as_asked && at < x.length; at += page) {
      as_asked = seen.insert(x.frame_offset + at).second;
      r.frames.push_back({tier, node, x.frame_offset + at, 0, page});
    }
  }
  if (!as_asked || total != pages * page) {
    if (node != m_space.node()) release_remote(extents);
    return Status(ErrorCode::internal, "node " + std::to_string(node) + " lent frames that are not what was asked (" +
                                           std::to_string(pages) + " pages of " + std::string(tier_name(tier)) + ")");
  }
  return r;
}

void Migrator::give_back(std::span<const Extent> frames) {
  if (frames.empty()) return;
  if (frames.front().node == m_space.node()) {
    m_space.return_frames({frames.begin(), frames.end()});
  } else {
    release_remote({frames.begin(), frames.end()});
  }
}

void Migrator::release_remote(const std::vector<Extent>& frames) {
  std::map<NodeId, proto::Request> by_node;
  for (const Extent& x : frames) {
    by_node[x.node].set_is_operator(true);
    wire::to_proto(x, by_node[x.node].mutable_release_frames()->add_extents());
  }
  for (auto& [node, request] : by_node) {
    auto r = m_peers->call(node, request);
    // Frames of an unreachable node stay reserved there until it restarts.
    if (!r.ok()) spdlog::warn("could not give frames back to node {}: {}", node, r.status().message());
  }
}

Status Migrator::copy_run(std::span<const PageMove> moves, std::span<const Extent> targets, Tier tier, NodeId to_node,
                          uint64_t incarnation) {
  const NodeId here = m_space.node();
  const uint64_t page = m_space.page_size();
  PeerAccess access(m_peers, m_transport, m_timeout);
  for (size_t i = 0; i < moves.size(); ++i) {
    if (to_node != here) TIERMEM_RETURN_IF_ERROR(access.ensure_frames(to_node, tier, targets[i].frame_offset, page));
    const PageEntry& from = moves[i].from;
    if (from.node != here) TIERMEM_RETURN_IF_ERROR(access.ensure_frames(from.node, from.tier, from.frame_offset, page));
  }
  TIERMEM_ASSIGN_OR_RETURN(FrameData * dst, m_space.frames(to_node, tier, &access));
  if (to_node != here) {
    // The frames were lent by that incarnation of the node: never write into
    // the memory of another (which may have given them to someone).
    TIERMEM_RETURN_IF_ERROR(access.expect_incarnation(to_node, incarnation));
  }
  // The pages' locks are ours: nobody changes them while they are copied.
  // Both tiers here: one batch per source tier (the copy engines for VRAM).
  TierBackend* into = to_node == here ? m_space.backend(tier) : nullptr;
  std::map<Tier, std::vector<FrameCopy>> local;
  for (size_t i = 0; i < moves.size(); ++i) {
    const PageEntry& from = moves[i].from;
    if (into != nullptr && from.node == here) {
      local[from.tier].push_back({from.frame_offset, targets[i].frame_offset, page});
      continue;
    }
    // Between nodes: a page at a time through this daemon's buffer.
    if (m_buffer.size() != page) m_buffer.resize(page);
    TIERMEM_ASSIGN_OR_RETURN(FrameData * src, m_space.frames(from.node, from.tier, &access));
    TIERMEM_RETURN_IF_ERROR(src->read(from.frame_offset, m_buffer.data(), m_buffer.size()));
    TIERMEM_RETURN_IF_ERROR(dst->write(targets[i].frame_offset, m_buffer.data(), m_buffer.size()));
  }
  for (auto& [source_tier, copies] : local) {
    TIERMEM_RETURN_IF_ERROR(into->copy_from_many(*m_space.backend(source_tier), coalesced(std::move(copies))));
  }
  return Status();
}

Status Migrator::move_run(std::span<const uint64_t> run, Tier tier, NodeId to_node,
                          std::vector<Extent>* remote_frames, uint64_t* moved) {
  *moved = 0;
  // Frames only for the pages not at the destination yet (a migration that
  // stopped part way, or to where some pages are): only this migration
  // moves the allocation's pages until it ends, so what it sees holds.
  std::vector<uint64_t> pages;
  for (uint64_t page : run) {
    TIERMEM_ASSIGN_OR_RETURN(const PageEntry e, m_space.page_entry(page));
    if (e.node != to_node || e.tier != tier) pages.push_back(page);
  }
  if (pages.empty()) return Status();
  TIERMEM_ASSIGN_OR_RETURN(const Reserved reserved, reserve(to_node, tier, pages.size()));
  // Writers finish their copy first; on a loaded machine that can take a
  // while, so wait as long as a transport operation may take. Ascending
  // order, as writers lock.
  std::vector<PageMove> moves;
  Status s;
  for (uint64_t page : pages) {
    auto move = m_space.begin_move(page, m_timeout);
    if (!move.ok()) {
      s = move.status();
      break;
    }
    if (move->from.node == to_node && move->from.tier == tier) {
      m_space.abort_move(*move);  // already there
      continue;
    }
    moves.push_back(*move);
  }
  const std::span<const Extent> targets(reserved.frames.data(), moves.size());
  if (s.ok() && !moves.empty()) s = copy_run(moves, targets, tier, to_node, reserved.incarnation);
  if (s.ok() && !moves.empty()) {
    std::vector<PageEntry> to(moves.size());
    for (size_t i = 0; i < moves.size(); ++i) {
      to[i].frame_offset = targets[i].frame_offset;
      to[i].node = to_node;
      to[i].tier = tier;
    }
    if (to_node != m_space.node()) m_space.note_lender(to_node, m_tenant, reserved.memory_generation);
    s = m_space.commit_moves(moves, to, remote_frames);
  }
  if (!s.ok()) {
    for (const PageMove& move : moves) m_space.abort_move(move);
    give_back(reserved.frames);
    return s;
  }
  give_back(std::span<const Extent>(reserved.frames).subspan(moves.size()));
  *moved = moves.size();
  return Status();
}

Result<uint64_t> Migrator::move_pages(Gva base, std::vector<uint64_t> pages, Tier tier) {
  if (tier == Tier::automatic) return Status(ErrorCode::invalid_argument, "pages move to a tier, not auto");
  TIERMEM_ASSIGN_OR_RETURN(auto before, m_space.translate(base));
  m_tenant = before.allocation.tenant;
  TIERMEM_ASSIGN_OR_RETURN(auto all, m_space.begin_migration(base));
  std::sort(pages.begin(), pages.end());
  std::vector<uint64_t> ours;
  std::set_intersection(pages.begin(), pages.end(), all.begin(), all.end(), std::back_inserter(ours));
  const uint64_t run = std::clamp<uint64_t>(k_run_bytes / m_space.page_size(), 1, k_run_pages);
  uint64_t moved_in_all = 0;
  Status status;
  for (size_t first = 0; first < ours.size() && status.ok(); first += run) {
    uint64_t moved = 0;
    status = move_run(std::span<const uint64_t>(ours).subspan(first, std::min<size_t>(run, ours.size() - first)), tier,
                      m_space.node(), nullptr, &moved);
    moved_in_all += moved;
  }
  m_space.end_migration(base);
  if (!status.ok()) {
    return status.with_context("moving " + std::to_string(ours.size()) + " page(s) of " + base.to_string() + " to " +
                               std::string(tier_name(tier)) + " (" + std::to_string(moved_in_all) +
                               " moved before the failure)");
  }
  return moved_in_all;
}

Result<MigrationResult> Migrator::migrate(Gva gva, Tier tier, NodeId to_node) {
  if (tier == Tier::automatic) {
    return Status(ErrorCode::invalid_argument, "migration needs a tier to move to (vram, dram or pmem)");
  }
  if (to_node == 0) to_node = m_space.node();
  if (to_node != m_space.node() && (m_peers == nullptr || !m_peers->knows(to_node))) {
    return Status(ErrorCode::bad_gva, "node " + std::to_string(to_node) + " is not in the cluster");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto before, m_space.translate(gva));
  m_tenant = before.allocation.tenant;
  TIERMEM_ASSIGN_OR_RETURN(auto pages, m_space.begin_migration(gva));
  MigrationResult result;
  std::vector<Extent> remote_frames;
  Status status;
  bool within_node = to_node == m_space.node();
  for (const Extent& x : before.extents) within_node = within_node && x.node == m_space.node();
  const uint64_t run = std::clamp<uint64_t>((within_node ? k_run_bytes : k_remote_run_bytes) / m_space.page_size(), 1,
                                            k_run_pages);
  for (size_t first = 0; first < pages.size(); first += run) {
    uint64_t moved = 0;
    status = move_run(std::span<const uint64_t>(pages).subspan(first, std::min<size_t>(run, pages.size() - first)),
                      tier, to_node, &remote_frames, &moved);
    result.pages_moved += moved;
    if (!status.ok()) break;
  }
  m_space.end_migration(gva);
  if (!remote_frames.empty()) release_remote(remote_frames);
  if (!status.ok()) {
    return status.with_context("migrating " + gva.to_string() + " (" + std::to_string(result.pages_moved) +
                               " pages moved before the failure)");
  }
  TIERMEM_ASSIGN_OR_RETURN(auto t, m_space.translate(gva));
  result.allocation = t.allocation;
  spdlog::info("migrated {} to {} on node {}: {} page(s) moved", gva.to_string(), tier_name(tier), to_node,
               result.pages_moved);
  return result;
}

}  // namespace tiermem
