#include "daemon/migrator.hpp"

#include <map>
#include <vector>

#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/peer_access.hpp"

namespace tiermem {

Result<Migrator::Reserved> Migrator::reserve(NodeId node, Tier tier) {
  if (node == m_space.node()) {
    TIERMEM_ASSIGN_OR_RETURN(auto frames, m_space.reserve_frames(tier, 1, m_tenant, m_limits, m_space.node()));
    return Reserved{frames.front(), 0, 0};
  }
  proto::Request request;
  request.mutable_reserve_frames()->set_tier(wire::to_proto(tier));
  request.mutable_reserve_frames()->set_pages(1);
  request.set_tenant(m_tenant);
  TIERMEM_ASSIGN_OR_RETURN(auto response, m_peers->call(node, request));
  if (response.reserve_frames().extents_size() != 1) {
    return Status(ErrorCode::internal, "node " + std::to_string(node) + " lent an unexpected frame set");
  }
  Reserved r;
  r.frame = wire::from_proto(response.reserve_frames().extents(0));
  r.memory_generation = response.reserve_frames().memory_generation();
  r.incarnation = response.reserve_frames().incarnation();
  if (r.frame.node != node || r.frame.tier != tier || r.frame.length != m_space.page_size()) {
    return Status(ErrorCode::internal, "node " + std::to_string(node) + " lent a frame that is not what was asked");
  }
  return r;
}

void Migrator::give_back(const Extent& frame) {
  if (frame.node == m_space.node()) {
    m_space.return_frames({frame});
  } else {
    release_remote({frame});
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

Status Migrator::move_page(uint64_t page, Tier tier, NodeId to_node, std::vector<Extent>* remote_frames,
                           bool* moved) {
  *moved = false;
  TIERMEM_ASSIGN_OR_RETURN(const Reserved reserved, reserve(to_node, tier));
  const Extent& target = reserved.frame;
  // Writers finish their copy first; on a loaded machine that can take a
  // while, so wait as long as a transport operation may take.
  auto move = m_space.begin_move(page, m_timeout);
  if (!move.ok()) {
    give_back(target);
    return move.status();
  }
  if (move->from.node == to_node && move->from.tier == tier) {
    m_space.abort_move(*move);
    give_back(target);
    return Status();
  }
  PeerAccess access(m_peers, m_transport, m_timeout);
  Status keys;
  if (to_node != m_space.node()) keys = access.ensure_frames(to_node, tier, target.frame_offset, target.length);
  if (keys.ok() && move->from.node != m_space.node()) {
    keys = access.ensure_frames(move->from.node, move->from.tier, move->from.frame_offset, m_space.page_size());
  }
  if (!keys.ok()) {
    m_space.abort_move(*move);
    give_back(target);
    return keys;
  }
  auto src = m_space.frames(move->from.node, move->from.tier, &access);
  auto dst = m_space.frames(to_node, tier, &access);
  Status s = !src.ok() ? src.status() : dst.status();
  if (s.ok() && to_node != m_space.node()) {
    // The frame was lent by that incarnation of the node: never write into
    // the memory of another (which may have given the frame to someone).
    s = access.expect_incarnation(to_node, reserved.incarnation);
  }
  if (s.ok()) {
    // The page's lock is ours: nobody changes it while it is copied.
    TierBackend* from = move->from.node == m_space.node() ? m_space.backend(move->from.tier) : nullptr;
    TierBackend* into = to_node == m_space.node() ? m_space.backend(tier) : nullptr;
    if (from != nullptr && into != nullptr) {
      // Both here: one copy between the tiers (the copy engines for VRAM).
      s = into->copy_from(*from, move->from.frame_offset, target.frame_offset, m_space.page_size());
    } else {
      if (m_buffer.size() != m_space.page_size()) m_buffer.resize(m_space.page_size());
      s = (*src)->read(move->from.frame_offset, m_buffer.data(), m_buffer.size());
      if (s.ok()) s = (*dst)->write(target.frame_offset, m_buffer.data(), m_buffer.size());
    }
  }
  if (!s.ok()) {
    m_space.abort_move(*move);
    give_back(target);
    return s;
  }
  PageEntry to;
  to.frame_offset = target.frame_offset;
  to.node = to_node;
  to.tier = tier;
  if (to_node != m_space.node()) m_space.note_lender(to_node, reserved.memory_generation);
  s = m_space.commit_move(*move, to, remote_frames);
  *moved = s.ok();
  return s;
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
  for (uint64_t page : pages) {
    bool moved = false;
    status = move_page(page, tier, to_node, &remote_frames, &moved);
    if (!status.ok()) break;
    result.pages_moved += moved;
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
