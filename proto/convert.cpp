#include "convert.hpp"

namespace tiermem::wire {

proto::Tier to_proto(Tier tier) { return static_cast<proto::Tier>(tier); }

Tier from_proto(proto::Tier tier) {
  switch (tier) {
    case proto::TIER_VRAM: return Tier::vram;
    case proto::TIER_DRAM: return Tier::dram;
    case proto::TIER_PMEM: return Tier::pmem;
    default: return Tier::automatic;
  }
}

void to_proto(const Gva& gva, proto::Gva* out) {
  out->set_node(gva.node);
  out->set_offset(gva.offset);
  out->set_generation(gva.generation);
}

Gva from_proto(const proto::Gva& gva) {
  Gva out;
  out.node = static_cast<NodeId>(gva.node());
  out.offset = gva.offset();
  out.generation = gva.generation();
  return out;
}

void to_proto(const Status& status, proto::Status* out) {
  out->set_code(static_cast<uint32_t>(status.code()));
  out->set_message(status.message());
}

Status from_proto(const proto::Status& status) {
  if (status.code() == 0) return Status();
  return Status(static_cast<ErrorCode>(status.code()), status.message());
}

void to_proto(const AllocationInfo& info, proto::AllocationInfo* out) {
  to_proto(info.gva, out->mutable_gva());
  out->set_size(info.size);
  out->set_tier(to_proto(info.tier));
  out->set_name(info.name);
  out->set_pages(info.pages);
  out->set_map_count(info.map_count);
  out->set_created_unix_ms(info.created_unix_ms);
  out->set_owner_uid(info.owner_uid);
  out->set_tenant(info.tenant);
  out->set_lost_pages(info.lost_pages);
  out->set_torn_pages(info.torn_pages);
  out->set_session(info.lifetime == Lifetime::session);
  out->set_replicas_wanted(info.replicas_wanted);
  for (const ReplicaInfo& r : info.replicas) {
    proto::Replica* p = out->add_replicas();
    p->set_node(r.node);
    to_proto(r.gva, p->mutable_gva());
    p->set_state(static_cast<uint32_t>(r.state));
  }
  if (info.replica_of.node != 0) to_proto(info.replica_of, out->mutable_replica_of());
  out->set_replica_ready(info.replica_ready);
  out->set_slot_bytes(info.slot_bytes);
  out->set_qos(static_cast<uint32_t>(info.qos));
  out->set_demotable(info.demotable);
}

AllocationInfo from_proto(const proto::AllocationInfo& info) {
  AllocationInfo out;
  out.gva = from_proto(info.gva());
  out.size = info.size();
  out.tier = from_proto(info.tier());
  out.name = info.name();
  out.pages = info.pages();
  out.map_count = info.map_count();
  out.created_unix_ms = info.created_unix_ms();
  out.owner_uid = info.owner_uid();
  out.tenant = info.tenant();
  out.lost_pages = info.lost_pages();
  out.torn_pages = info.torn_pages();
  out.lifetime = info.session() ? Lifetime::session : Lifetime::persistent;
  out.replicas_wanted = info.replicas_wanted();
  for (const proto::Replica& r : info.replicas()) {
    // Anything but in_sync is treated as a copy not to rely on.
    const auto state = r.state() == 0 ? ReplicaState::in_sync : ReplicaState::dropped;
    out.replicas.push_back({static_cast<NodeId>(r.node()), from_proto(r.gva()), state});
  }
  if (info.has_replica_of()) out.replica_of = from_proto(info.replica_of());
  out.replica_ready = info.replica_ready();
  out.slot_bytes = info.slot_bytes();
  out.demotable = info.demotable();
  out.qos = info.qos() <= static_cast<uint32_t>(QosClass::graceful_degrade) ? static_cast<QosClass>(info.qos())
                                                                            : QosClass::standard;
  return out;
}

void to_proto(const TierStat& stat, proto::TierInfo* out) {
  out->set_tier(to_proto(stat.tier));
  out->set_capacity_bytes(stat.capacity_bytes);
  out->set_used_bytes(stat.used_bytes);
  out->set_free_bytes(stat.free_bytes);
  out->set_persistent(stat.persistent);
  out->set_shareable(stat.shareable);
  out->set_backing(stat.backing);
  out->set_allocations(stat.allocations);
}

TierStat from_proto(const proto::TierInfo& info) {
  TierStat out;
  out.tier = from_proto(info.tier());
  out.capacity_bytes = info.capacity_bytes();
  out.used_bytes = info.used_bytes();
  out.free_bytes = info.free_bytes();
  out.persistent = info.persistent();
  out.shareable = info.shareable();
  out.backing = info.backing();
  out.allocations = info.allocations();
  return out;
}

void to_proto(const PageInfo& page, proto::PageInfo* out) {
  out->set_page_index(page.page_index);
  out->set_tier(to_proto(page.tier));
  out->set_node(page.node);
  out->set_frame_offset(page.frame_offset);
  out->set_flags(page.flags);
  out->set_version(page.version);
  out->set_valid_mask(page.valid_mask);
  out->set_dirty_mask(page.dirty_mask);
  out->set_epoch(page.epoch);
  out->set_sequence(page.sequence);
  out->set_locked(page.locked);
  out->set_exclusive_pending(page.exclusive_pending);
}

PageInfo from_proto(const proto::PageInfo& page) {
  PageInfo out;
  out.page_index = page.page_index();
  out.tier = from_proto(page.tier());
  out.node = static_cast<NodeId>(page.node());
  out.frame_offset = page.frame_offset();
  out.flags = page.flags();
  out.version = page.version();
  out.valid_mask = page.valid_mask();
  out.dirty_mask = page.dirty_mask();
  out.epoch = static_cast<uint16_t>(page.epoch());
  out.sequence = page.sequence();
  out.locked = page.locked();
  out.exclusive_pending = page.exclusive_pending();
  return out;
}

void to_proto(const Extent& extent, proto::Extent* out) {
  out->set_tier(to_proto(extent.tier));
  out->set_node(extent.node);
  out->set_frame_offset(extent.frame_offset);
  out->set_gva_offset(extent.gva_offset);
  out->set_length(extent.length);
  out->set_memory_generation(extent.memory_generation);
}

Extent from_proto(const proto::Extent& extent) {
  Extent out;
  out.tier = from_proto(extent.tier());
  out.node = static_cast<NodeId>(extent.node());
  out.frame_offset = extent.frame_offset();
  out.gva_offset = extent.gva_offset();
  out.length = extent.length();
  out.memory_generation = extent.memory_generation();
  return out;
}

}  // namespace tiermem::wire

namespace tiermem::wire {

NodeInfo from_proto(const proto::NodeInfo& n) {
  NodeInfo info;
  info.node = static_cast<NodeId>(n.node_id());
  info.control_address = n.control_address();
  info.state = static_cast<NodeState>(n.state());
  info.incarnation = n.incarnation();
  info.transports = n.transports();
  info.last_error = n.last_error();
  info.state_since_ms = n.state_since_ms();
  info.health = static_cast<NodeHealth>(n.health());
  info.health_since_ms = n.health_since_ms();
  info.last_heartbeat_ms = n.last_heartbeat_ms();
  info.missed_heartbeats = n.missed_heartbeats();
  info.heartbeat_rtt_us = n.heartbeat_rtt_us();
  return info;
}

CheckInEdge from_proto(NodeId node, const proto::ClientEdge& c) {
  CheckInEdge e;
  e.node = node;
  e.session = c.session();
  e.client_name = c.client_name();
  e.pid = c.pid();
  e.uid = c.uid();
  e.tenant = c.tenant();
  e.health = static_cast<NodeHealth>(c.health());
  e.health_since_ms = c.health_since_ms();
  e.last_checkin_ms = c.last_checkin_ms();
  e.missed = c.missed();
  e.interval_ms = c.interval_ms();
  return e;
}

NodeStat from_proto(const proto::StatResponse& s) {
  NodeStat out;
  out.node = static_cast<NodeId>(s.node_id());
  out.page_size = s.page_size();
  for (const auto& t : s.tiers()) out.tiers.push_back(from_proto(t));
  out.allocations = s.allocations();
  out.sessions = s.sessions();
  out.uptime_ms = s.uptime_ms();
  out.daemon_version = s.daemon_version();
  out.socket_path = s.socket_path();
  out.fabric = s.fabric().empty() ? "ucx" : s.fabric();  // a daemon from before libfabric: UCX
  out.locks_broken = s.locks_broken();
  out.truncations_repaired = s.truncations_repaired();
  out.files_trimmed = s.files_trimmed();
  out.trimmed_bytes = s.trimmed_bytes();
  const proto::RecoveryInfo& r = s.recovery();
  out.recovery.durable = r.durable();
  out.recovery.memory_adopted = r.memory_adopted();
  out.recovery.starts = r.starts();
  out.recovery.allocations = r.allocations();
  out.recovery.lost_allocations = r.lost_allocations();
  out.recovery.lost_pages = r.lost_pages();
  out.recovery.dropped = r.dropped();
  out.recovery.lent_frames = r.lent_frames();
  out.recovery.locks_broken = r.locks_broken();
  out.recovery.elapsed_ms = r.elapsed_ms();
  out.recovery.lost.assign(r.lost().begin(), r.lost().end());
  out.recovery.domains_made_anew.assign(r.domains_made_anew().begin(), r.domains_made_anew().end());
  out.recovery.pool = r.pool();
  return out;
}

MappingDump from_proto(const proto::DumpResponse& d) {
  MappingDump out;
  out.node = static_cast<NodeId>(d.node_id());
  out.page_size = d.page_size();
  out.l2_pages = d.l2_pages();
  for (const auto& a : d.allocations()) out.allocations.push_back(from_proto(a));
  for (const auto& p : d.pages()) out.pages.push_back(from_proto(p));
  return out;
}

Translation from_proto(const proto::TranslateResponse& t) {
  Translation x;
  x.allocation = from_proto(t.allocation());
  x.offset_in_allocation = t.offset_in_allocation();
  if (t.pages_size() > 0) x.page = from_proto(t.pages(0));
  for (const auto& e : t.extents()) x.extents.push_back(from_proto(e));
  return x;
}

NodeAdvert advert_of(const proto::NodeInfo& info) {
  NodeAdvert a;
  a.node = static_cast<NodeId>(info.node_id());
  a.incarnation = info.incarnation();
  a.pages_per_domain = info.pages_per_domain();
  a.transport_address = info.transport_address();
  a.regions_version = info.regions_version();
  for (const proto::RegionKey& k : info.regions()) {
    a.regions.push_back({k.kind() == proto::Region::VERSIONS, from_proto(k.tier()), k.domain(), k.first(), k.base(),
                         k.length(), k.packed_key(), k.persistent(), k.memory_generation()});
  }
  return a;
}

}  // namespace tiermem::wire
