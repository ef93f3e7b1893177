// tiermemd configuration (O2): one TOML file, every key documented in
// config/tiermemd.toml. Read once at start into DaemonConfig.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

struct DaemonConfig {
  std::string source = "(built-in defaults)";  // file the values came from

  NodeId node_id = 1;

  std::string socket_path = "/run/tiermem/tiermemd.sock";
  uint32_t socket_mode = 0660;
  uint64_t max_frame_bytes = 16 << 20;
  uint64_t max_inline_bytes = 8 << 20;

  uint64_t page_size = 2 << 20;
  uint64_t virtual_pages = 0;  // 0: 16x the frames

  bool dram_enabled = true;
  uint64_t dram_capacity = uint64_t{1} << 30;

  bool pmem_enabled = true;
  std::string pmem_path = "/var/lib/tiermem/pmem.pool";
  uint64_t pmem_capacity = uint64_t{1} << 30;

  bool vram_enabled = true;
  bool vram_required = false;  // fail start-up when no GPU, instead of running without
  int vram_device = 0;
  uint64_t vram_capacity = 0;  // 0: half of the device's free memory

  std::string log_level = "info";

  // Cluster: empty file = this daemon runs alone.
  std::string cluster_file;
  std::string cluster_listen;           // bind address for peers; empty: this node's control address
  uint64_t reconnect_interval_ms = 500;
  uint64_t heartbeat_interval_ms = 1000;
  uint64_t peer_timeout_ms = 5000;      // one peer request (and the heartbeat) may take this long

  std::string transport_tls;            // UCX transports (UCX_TLS syntax); empty: UCX's choice
  std::string transport_devices;        // UCX network devices (UCX_NET_DEVICES syntax); empty: all
  uint64_t transport_timeout_ms = 10000;  // one-sided operations of migrations and remote copies
};

// Parses TOML text. Errors: config_error naming the source, the line and the
// key for syntax errors, unknown keys, wrong types and invalid values.
Result<DaemonConfig> parse_config(std::string_view text, std::string_view source);
// Reads and parses a file. Errors: config_error (also when unreadable).
Result<DaemonConfig> load_config(const std::string& path);

// Every key the parser understands, as "section.key", in reading order.
std::vector<std::string> known_config_keys();

}  // namespace tiermem
