// tiermemd configuration (O2): one TOML file, every key documented in
// config/tiermemd.toml. Read once at start into DaemonConfig.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

// A tenant (O5): the uids and groups whose clients it is, and its quotas.
struct TenantConfig {
  std::string name;
  std::vector<uint32_t> uids;
  std::vector<uint32_t> gids;         // members of any of these groups (primary or not)
  std::array<uint64_t, 4> quota{};    // bytes per tier (indexed by Tier); 0: no limit
};

struct DaemonConfig {
  std::string source = "(built-in defaults)";  // file the values came from

  NodeId node_id = 1;

  std::string socket_path = "/run/tiermem/tiermemd.sock";
  uint32_t socket_mode = 0660;
  std::string socket_group;  // group of the socket (name or number); empty: the daemon's
  uint64_t max_frame_bytes = 16 << 20;
  uint64_t max_inline_bytes = 8 << 20;
  uint64_t frame_timeout_ms = 10000;       // a started frame (or the first one) must arrive within
  uint64_t max_connections = 1024;         // sessions at once, clients and peers
  uint64_t max_connections_per_uid = 256;  // client sessions of one uid at once
  // Bytes of frames being read or handled at once (and of the replies of
  // reads), in all and of one uid's sessions; a frame that does not fit
  // waits for room (within frame_timeout_ms). Each is at least
  // max_frame_bytes. Authenticated peers are not counted (ARCHITECTURE.md).
  uint64_t frame_budget_bytes = uint64_t{256} << 20;
  uint64_t frame_budget_per_uid_bytes = uint64_t{64} << 20;

  uint64_t page_size = 2 << 20;
  uint64_t pages_per_tenant = 0;  // virtual pages of each tenant's range; 0: 16x the frames
  // Allocations of at most this many bytes share pages (M10); 0: none do.
  // Unset (k_sub_page_auto): an eighth of a page.
  static constexpr uint64_t k_sub_page_auto = ~uint64_t{0};
  uint64_t sub_page_max = k_sub_page_auto;
  uint64_t sub_page_bytes() const { return sub_page_max == k_sub_page_auto ? page_size / 8 : sub_page_max; }

  bool dram_enabled = true;
  uint64_t dram_capacity = uint64_t{1} << 30;
  // The node's shared memory: version words and DRAM frames, a file per
  // tenant. Empty: /dev/shm/tiermem-node<id>.
  std::string dram_path;

  bool pmem_enabled = true;
  std::string pmem_path = "/var/lib/tiermem/pmem";  // a directory: a pool file per tenant
  uint64_t pmem_capacity = uint64_t{1} << 30;

  bool vram_enabled = true;
  bool vram_required = false;  // fail start-up when no GPU, instead of running without
  int vram_device = 0;
  uint64_t vram_capacity = 0;  // 0: half of the device's free memory
  // Page-lock DRAM frames (64 MiB at a time, as they are handed out) for the
  // copy engines, so that copies between VRAM and DRAM run at their speed.
  bool vram_pin_dram = true;

  std::string log_level = "info";

  // Tenants (O5). A client's tenant comes from its uid and groups (Unix
  // peer credentials); uid 0 and members of admin_group are operators.
  uint32_t max_tenants_per_node = 16;
  std::string admin_group;        // a group name or number; empty: root only
  bool unlisted_refused = false;  // a uid in no tenant: refused (true) or a tenant of its own, "uid:N"
  std::array<uint64_t, 4> default_quota{};  // of such tenants, bytes per tier; 0: no limit
  std::vector<TenantConfig> tenants;

  // Durable mapping metadata (H5): a PMDK pool recording every persistent
  // allocation, so that a restarted daemon serves them again (PMEM always,
  // DRAM while the node's shared memory survives: not a reboot). Off: a
  // daemon start forgets everything, as before.
  bool metadata_enabled = true;
  // The pool file; empty: <tiers.pmem.path>/metadata.pool, or
  // <tiers.dram.path>/metadata.pool without PMEM (then it is as volatile as
  // the shared memory).
  std::string metadata_path;
  uint64_t metadata_max_allocations = 65536;

  // Stale clients of an earlier daemon on the same directory: how long the
  // daemon waits at start for page locks they still hold. Also how long a
  // client whose session ended may go on living before its locks are broken.
  uint64_t stale_writer_grace_ms = 2000;
  // Leases (O6): how long the session allocations of a session that ended
  // while its process lives on wait for it to connect again; 0: freed at
  // once, as those of a process that is gone always are.
  uint64_t lease_grace_ms = 1000;

  // Cluster: empty file = this daemon runs alone.
  std::string cluster_file;
  std::string cluster_listen;           // bind address for peers; empty: this node's control address
  uint64_t reconnect_interval_ms = 500;
  uint64_t heartbeat_interval_ms = 1000;
  uint64_t peer_timeout_ms = 5000;      // one peer request (and the heartbeat) may take this long
  // Health (H1): unanswered heartbeats in a row that make a peer DEGRADED,
  // and how long without an answer makes it UNREACHABLE (the seed's 30 s).
  uint64_t health_degraded_after_missed = 2;
  uint64_t health_unreachable_after_ms = 30000;
  // Replication (H2): how long a copy's node must be unreachable before its
  // home writes on without it (0: twice health.unreachable_after_ms), how
  // often copies are checked and replaced, and the age below which a copy
  // is never taken for an orphan.
  uint64_t replication_drop_after_ms = 0;
  uint64_t replication_repair_interval_ms = 1000;
  uint64_t replication_orphan_min_age_ms = 10000;
  // Demotion (M7, daemon/demoter.hpp): cold pages of demotable allocations
  // move down the tiers when a tier passes high_water_percent of its
  // capacity, until it is under low_water_percent; checked every interval_ms.
  bool demotion_enabled = true;
  uint32_t demotion_high_water_percent = 90;
  uint32_t demotion_low_water_percent = 80;
  uint64_t demotion_interval_ms = 500;
  // The cluster's shared secret (S2): peers prove they know it before
  // anything is served to them. Required when there is a cluster file; the
  // file must not be readable by group or others.
  std::string secret_file;

  // The data plane's fabric: "ucx" or "libfabric" (every node of a cluster
  // alike: peers refuse a node on another fabric at the handshake).
  std::string transport_fabric = "ucx";
  // libfabric's provider ("tcp;ofi_rxm", "shm", "efa", ...); empty with
  // UCX. Left empty with libfabric, parse_config sets k_default_provider.
  std::string transport_provider;
  static constexpr const char* k_default_provider = "tcp;ofi_rxm";
  std::string transport_tls;            // UCX transports (UCX_TLS syntax); empty: UCX's choice
  std::string transport_devices;        // UCX network devices (UCX_NET_DEVICES syntax); empty: all
  uint64_t transport_keepalive_interval_ms = 0;  // UCX keepalive of peer endpoints; 0: UCX's default
  uint64_t transport_timeout_ms = 10000;  // one-sided operations of migrations and remote copies

  // Metrics (O4): whether requests are counted, and host:port of the
  // Prometheus endpoint's HTTP listener (empty: none; tiermemctl stats
  // still shows them).
  bool metrics_enabled = true;
  std::string metrics_listen;
};

// Parses TOML text. Errors: config_error naming the source, the line and the
// key for syntax errors, unknown keys, wrong types and invalid values.
Result<DaemonConfig> parse_config(std::string_view text, std::string_view source);
// Reads and parses a file. Errors: config_error (also when unreadable).
Result<DaemonConfig> load_config(const std::string& path);

// The metadata pool's file (metadata.path, or its default).
std::string metadata_pool_path(const DaemonConfig& config);

// Every key the parser understands, as "section.key", in reading order.
std::vector<std::string> known_config_keys();

}  // namespace tiermem
