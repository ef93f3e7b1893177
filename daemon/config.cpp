#include "daemon/config.hpp"

#include <sys/statvfs.h>

#include <bit>
#include <charconv>
#include <fstream>
#include <filesystem>
#include <set>
#include <sstream>

#include <unistd.h>

#include <toml++/toml.h>

#include <tiermem/status_macros.h>
#include <tiermem/types.h>

#include <tiermem/units.h>

#include "daemon/tenants.hpp"

namespace tiermem {
namespace {

// Walks the document, converting known keys and remembering them so that any
// key left over is reported (a typo must not silently keep a default).
class ConfigReader {
 public:
  ConfigReader(const toml::table& root, std::string_view source)
      : m_root(root), m_source(source) {}

  template <typename T>
  void integer(std::string_view path, T* out, int64_t min, int64_t max) {
    const toml::node* n = find(path);
    if (n == nullptr) return;
    auto v = n->value<int64_t>();
    if (!v) return fail(*n, path, "must be an integer");
    if (*v < min || *v > max) {
      return fail(*n, path, "must be between " + std::to_string(min) + " and " + std::to_string(max));
    }
    *out = static_cast<T>(*v);
  }

  void size(std::string_view path, uint64_t* out) {
    const toml::node* n = find(path);
    if (n == nullptr) return;
    if (auto i = n->value<int64_t>()) {
      if (*i < 0) return fail(*n, path, "must not be negative");
      *out = static_cast<uint64_t>(*i);
      return;
    }
    auto s = n->value<std::string>();
    if (!s) return fail(*n, path, "must be a size such as 1073741824 or \"1GiB\"");
    auto parsed = parse_size(*s);
    if (!parsed.ok()) return fail(*n, path, parsed.status().message());
    *out = *parsed;
  }

  void string(std::string_view path, std::string* out) {
    const toml::node* n = find(path);
    if (n == nullptr) return;
    auto s = n->value<std::string>();
    if (!s) return fail(*n, path, "must be a string");
    *out = *s;
  }

  void boolean(std::string_view path, bool* out) {
    const toml::node* n = find(path);
    if (n == nullptr) return;
    auto b = n->value<bool>();
    if (!b) return fail(*n, path, "must be true or false");
    *out = *b;
  }

  void octal_mode(std::string_view path, uint32_t* out) {
    const toml::node* n = find(path);
    if (n == nullptr) return;
    auto s = n->value<std::string>();
    uint32_t mode = 0;
    if (s) {
      const char* end = s->data() + s->size();
      const auto [at, ec] = std::from_chars(s->data(), end, mode, 8);
      // An overflowing mode ("77777777777777777777") is an error, not an exception.
      if (ec != std::errc() || at != end) s.reset();
    }
    if (!s || mode > 0777) return fail(*n, path, "must be an octal mode in quotes, such as \"0660\"");
    *out = mode;
  }

  std::vector<std::string> known() const { return {m_known.begin(), m_known.end()}; }
  // A key read by custom code (arrays of tables): known, not walked.
  const toml::node* claim(std::string_view path) { return find(path); }

  // Reports keys nobody asked for. Call after every known key was read.
  void reject_unknown() { walk(m_root, ""); }

  void fail(const toml::node& n, std::string_view path, const std::string& why) {
    if (!m_status.ok()) return;
    m_status = Status(ErrorCode::config_error, std::string(m_source) + ":" +
                                                   std::to_string(n.source().begin.line) + ": " +
                                                   std::string(path) + " " + why);
  }

  const Status& status() const { return m_status; }

 private:
  const toml::node* find(std::string_view path) {
    m_known.insert(std::string(path));
    return m_root.at_path(path).node();
  }

  void walk(const toml::table& table, const std::string& prefix) {
    for (const auto& [key, node] : table) {
      const std::string path = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
      if (const toml::table* sub = node.as_table()) {
        if (!is_known_prefix(path)) fail(node, path, "is not a known section");
        else walk(*sub, path);
      } else if (m_known.count(path) == 0 && m_known.count(prefix) == 0) {
        fail(node, path, "is not a known key (see config/tiermemd.toml for every key)");
      }
    }
  }

  bool is_known_prefix(const std::string& prefix) const {
    for (const auto& k : m_known) {
      if (k.size() > prefix.size() && k.compare(0, prefix.size(), prefix) == 0 && k[prefix.size()] == '.') {
        return true;
      }
    }
    return false;
  }

  const toml::table& m_root;
  std::string_view m_source;
  std::set<std::string> m_known;
  Status m_status;
};

void read_all(ConfigReader& r, DaemonConfig* out);

// The largest frame the wire format carries (its length is 32 bits; a gigabyte
// is more than any request needs).
constexpr uint64_t k_max_frame_limit = uint64_t{1} << 30;

// DRAM that the machine cannot give is refused before anything is taken:
// the tier is shared memory (/dev/shm), so both physical memory and the
// space of the file system behind the DRAM directory bound it.
Status check_memory(uint64_t capacity, const std::string& dir, std::string_view source) {
  const auto pages = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES));
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t physical = pages * page;
  if (pages > 0 && capacity > physical) {
    return Status(ErrorCode::config_error, std::string(source) + ": tiers.dram.capacity " + format_size(capacity) +
                                               " is more than this machine's memory (" + format_size(physical) + ")");
  }
  // The file system the directory is (or will be) on: its nearest existing
  // ancestor's.
  std::filesystem::path at(dir);
  std::error_code ec;
  while (!at.empty() && !std::filesystem::exists(at, ec)) at = at.parent_path();
  struct statvfs fs {};
  if (!at.empty() && ::statvfs(at.c_str(), &fs) == 0 && fs.f_blocks > 0) {
    const uint64_t size = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    if (capacity > size) {
      return Status(ErrorCode::config_error,
                    std::string(source) + ": tiers.dram.capacity " + format_size(capacity) + " is more than the " +
                        format_size(size) + " file system holding tiers.dram.path " + dir +
                        " (for /dev/shm: mount -o remount,size=... /dev/shm)");
    }
  }
  return Status();
}

Status check_tenants(const DaemonConfig& c, std::string_view source) {
  std::set<std::string> names;
  std::set<uint32_t> uids;
  for (const TenantConfig& t : c.tenants) {
    const auto bad = [&](const std::string& why) {
      return Status(ErrorCode::config_error, std::string(source) + ": tenant '" + t.name + "' " + why);
    };
    if (t.name.empty() || t.name.size() > 63 || t.name.rfind("uid:", 0) == 0 ||
        t.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            std::string::npos) {
      return bad("needs a name of 1-63 letters, digits, '.', '_' or '-' (names \"uid:N\" are the daemon's own)");
    }
    if (!names.insert(t.name).second) return bad("is listed twice");
    if (t.uids.empty() && t.gids.empty()) return bad("has neither uids nor gids: nobody could be it");
    for (uint32_t uid : t.uids) {
      if (!uids.insert(uid).second) return bad("lists uid " + std::to_string(uid) + ", which another tenant has");
    }
  }
  if (c.tenants.size() > c.max_tenants_per_node && c.unlisted_refused) {
    return Status(ErrorCode::config_error, std::string(source) + ": " + std::to_string(c.tenants.size()) +
                                               " tenants but tenants.max_per_node is " +
                                               std::to_string(c.max_tenants_per_node));
  }
  return Status();
}

Result<uint64_t> size_of(const toml::node& n) {
  if (auto i = n.value<int64_t>()) {
    if (*i < 0) return Status(ErrorCode::invalid_argument, "must not be negative");
    return static_cast<uint64_t>(*i);
  }
  if (auto text = n.value<std::string>()) return parse_size(*text);
  return Status(ErrorCode::invalid_argument, "must be a size such as 1073741824 or \"1GiB\"");
}

// [[tenant]] tables: name, uids, gids, quota = { dram = "4GiB", ... }.
void read_tenants(ConfigReader& r, const toml::table& root, DaemonConfig* out) {
  const toml::node* n = r.claim("tenant");
  if (n == nullptr) return;
  const toml::array* list = n->as_array();
  if (list == nullptr) return r.fail(*n, "tenant", "must be [[tenant]] tables");
  for (const toml::node& entry : *list) {
    const toml::table* t = entry.as_table();
    if (t == nullptr) return r.fail(entry, "tenant", "entries must be tables");
    TenantConfig tc;
    for (const auto& [key, value] : *t) {
      const std::string k(key.str());
      if (k == "name") {
        if (auto v = value.value<std::string>()) tc.name = *v;
        else return r.fail(value, "tenant.name", "must be a string");
      } else if (k == "uids" || k == "gids") {
        const toml::array* ids = value.as_array();
        if (ids == nullptr) return r.fail(value, "tenant." + k, "must be an array of numbers");
        for (const toml::node& id : *ids) {
          auto v = id.value<int64_t>();
          if (!v || *v < 0 || *v > 0xfffffffe) return r.fail(id, "tenant." + k, "must hold numbers from 0 to 4294967294");
          (k == "uids" ? tc.uids : tc.gids).push_back(static_cast<uint32_t>(*v));
        }
      } else if (k == "quota") {
        const toml::table* q = value.as_table();
        if (q == nullptr) return r.fail(value, "tenant.quota", "must be a table such as { dram = \"4GiB\" }");
        for (const auto& [tier_name_key, size] : *q) {
          auto tier = parse_tier(tier_name_key.str());
          auto bytes = size_of(size);
          if (!tier.ok() || *tier == Tier::automatic) return r.fail(size, "tenant.quota", "keys are vram, dram or pmem");
          if (!bytes.ok()) return r.fail(size, "tenant.quota." + std::string(tier_name_key.str()), bytes.status().message());
          tc.quota[static_cast<size_t>(*tier)] = *bytes;
        }
      } else {
        return r.fail(value, "tenant." + k, "is not a known key (name, uids, gids, quota)");
      }
    }
    out->tenants.push_back(std::move(tc));
  }
  (void)root;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// [transport]: the fabric, and only the keys of that fabric. A key of the
// other fabric is refused rather than ignored: an operator who set it meant
// something by it.
Status check_fabric(const DaemonConfig& c, std::string_view source) {
  auto bad = [&](const std::string& why) {
    return Status(ErrorCode::config_error, std::string(source) + ": " + why);
  };
  if (c.transport_fabric == "ucx") {
    if (c.transport_provider.empty()) return Status();
    return bad("transport.provider = " + quoted(c.transport_provider) +
               " is libfabric's, but transport.fabric is \"ucx\"; set fabric = \"libfabric\" to use it, or leave "
               "provider out for UCX");
  }
  if (c.transport_fabric != "libfabric") {
    return bad("transport.fabric = " + quoted(c.transport_fabric) + " is not a fabric; expected \"ucx\" (the " +
               "default) or \"libfabric\"");
  }
  if (!c.transport_tls.empty() || !c.transport_devices.empty()) {
    const std::string key = !c.transport_tls.empty() ? "transport.tls = " + quoted(c.transport_tls)
                                                     : "transport.devices = " + quoted(c.transport_devices);
    return bad(key + " with transport.fabric = \"libfabric\": tls and devices are UCX's; libfabric takes provider " +
               "(such as \"tcp;ofi_rxm\" or \"verbs;ofi_rxm\"); leave tls and devices empty");
  }
  // The provider travels in the transport's address, a space-separated
  // line ("tmofi1 <provider> ..."): fi_info's names have no spaces.
  if (c.transport_provider.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_;-") !=
      std::string::npos) {
    return bad("transport.provider = " + quoted(c.transport_provider) +
               " is not a provider's name; expected one as fi_info -l lists them, such as \"tcp;ofi_rxm\", " +
               "\"shm\", \"efa\", \"verbs;ofi_rxm\" or \"cxi\"");
  }
  return Status();
}

Status check(const DaemonConfig& c, std::string_view source) {
  auto bad = [&](const std::string& why) {
    return Status(ErrorCode::config_error, std::string(source) + ": " + why);
  };
  if (!std::has_single_bit(c.page_size) || c.page_size < 4096) {
    return bad("mapping.page_size " + std::to_string(c.page_size) +
               " must be a power of two of at least 4 KiB");
  }
  if (c.sub_page_bytes() > c.page_size / 2) {
    return bad("mapping.sub_page_max " + format_size(c.sub_page_bytes()) + " is more than half a page (" +
               format_size(c.page_size) + "): a shared page must hold at least two");
  }
  if (c.socket_path.empty()) return bad("control.socket must not be empty");
  if (c.socket_path.size() >= 108) return bad("control.socket path is longer than a Unix socket allows (107)");
  if (!c.socket_group.empty()) TIERMEM_RETURN_IF_ERROR(resolve_group(c.socket_group, "control.socket_group", source).status());
  if (c.max_frame_bytes < 4096) return bad("control.max_frame_bytes must be at least 4 KiB");
  if (c.max_frame_bytes > k_max_frame_limit) {
    return bad("control.max_frame_bytes " + format_size(c.max_frame_bytes) + " is more than a frame can be (" +
               format_size(k_max_frame_limit) + ")");
  }
  if (c.max_inline_bytes + 4096 > c.max_frame_bytes) {
    return bad("control.max_inline_bytes must be at least 4 KiB below control.max_frame_bytes");
  }
  for (const auto& [key, value] : {std::pair{"control.frame_budget_bytes", c.frame_budget_bytes},
                                   std::pair{"control.frame_budget_per_uid_bytes", c.frame_budget_per_uid_bytes}}) {
    if (value < c.max_frame_bytes) {
      return bad(std::string(key) + " " + format_size(value) + " is less than control.max_frame_bytes (" +
                 format_size(c.max_frame_bytes) + "): a frame that large could never be read; raise it to at least " +
                 "that");
    }
  }
  if (c.dram_enabled && c.dram_capacity < c.page_size) return bad("tiers.dram.capacity is smaller than one page");
  if (c.pmem_enabled && c.pmem_capacity < c.page_size) return bad("tiers.pmem.capacity is smaller than one page");
  if (c.pmem_enabled && c.pmem_path.empty()) return bad("tiers.pmem.path must name the pool directory");
  if (c.dram_enabled) TIERMEM_RETURN_IF_ERROR(check_memory(c.dram_capacity, c.dram_path, source));
  if (c.max_tenants_per_node == 0) return bad("tenants.max_per_node must be at least 1");
  TIERMEM_RETURN_IF_ERROR(check_tenants(c, source));
  if (!c.dram_enabled && !c.pmem_enabled && !c.vram_enabled) return bad("every tier is disabled");
  if (c.demotion_low_water_percent >= c.demotion_high_water_percent) {
    return bad("demotion.low_water_percent " + std::to_string(c.demotion_low_water_percent) +
               " must be below demotion.high_water_percent " + std::to_string(c.demotion_high_water_percent) +
               ": demotion moves pages until a tier is under the low mark");
  }
  if (!c.metrics_listen.empty() && !c.metrics_enabled) {
    return bad("metrics.listen is set but metrics.enabled is false: an endpoint would serve nothing");
  }
  if (!c.metrics_listen.empty()) {
    const size_t colon = c.metrics_listen.rfind(':');
    const std::string port = colon == std::string::npos ? "" : c.metrics_listen.substr(colon + 1);
    if (colon == 0 || port.empty() || port.size() > 5 ||
        port.find_first_not_of("0123456789") != std::string::npos || std::stoul(port) > 65535) {
      return bad("metrics.listen '" + c.metrics_listen + "' is not host:port (e.g. 127.0.0.1:9464)");
    }
  }
  TIERMEM_RETURN_IF_ERROR(check_fabric(c, source));
  static const std::set<std::string> k_levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (k_levels.count(c.log_level) == 0) {
    return bad("log.level '" + c.log_level + "' is not one of trace, debug, info, warn, error, critical, off");
  }
  return Status();
}

}  // namespace

Result<DaemonConfig> parse_config(std::string_view text, std::string_view source) {
  // Debian's toml++ is built with exceptions; the only one it throws is
  // caught right here and becomes a Status.
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    return Status(ErrorCode::config_error, std::string(source) + ":" +
                                               std::to_string(err.source().begin.line) + ": " +
                                               std::string(err.description()));
  }
  DaemonConfig c;
  c.source = std::string(source);
  ConfigReader r(root, source);
  read_all(r, &c);
  read_tenants(r, root, &c);
  r.reject_unknown();
  if (c.dram_path.empty()) c.dram_path = "/dev/shm/tiermem-node" + std::to_string(c.node_id);
  if (c.transport_fabric == "libfabric" && c.transport_provider.empty()) {
    c.transport_provider = DaemonConfig::k_default_provider;
  }
  if (!r.status().ok()) return r.status();
  Status s = check(c, source);
  if (!s.ok()) return s;
  return c;
}

std::vector<std::string> known_config_keys() {
  const toml::table empty;
  ConfigReader r(empty, "");
  DaemonConfig c;
  read_all(r, &c);
  return r.known();
}

namespace {

void read_all(ConfigReader& r, DaemonConfig* out) {
  DaemonConfig& c = *out;
  r.integer("node.id", &c.node_id, 1, 0xffff);
  r.string("control.socket", &c.socket_path);
  r.octal_mode("control.socket_mode", &c.socket_mode);
  r.string("control.socket_group", &c.socket_group);
  r.size("control.max_frame_bytes", &c.max_frame_bytes);
  r.size("control.max_inline_bytes", &c.max_inline_bytes);
  r.integer("control.frame_timeout_ms", &c.frame_timeout_ms, 10, 3600000);
  r.integer("control.max_connections", &c.max_connections, 1, 1 << 20);
  r.integer("control.max_connections_per_uid", &c.max_connections_per_uid, 1, 1 << 20);
  r.size("control.frame_budget_bytes", &c.frame_budget_bytes);
  r.size("control.frame_budget_per_uid_bytes", &c.frame_budget_per_uid_bytes);
  r.size("mapping.page_size", &c.page_size);
  r.integer("mapping.pages_per_tenant", &c.pages_per_tenant, 0, int64_t{1} << 36);
  r.size("mapping.sub_page_max", &c.sub_page_max);
  r.boolean("tiers.dram.enabled", &c.dram_enabled);
  r.size("tiers.dram.capacity", &c.dram_capacity);
  r.string("tiers.dram.path", &c.dram_path);
  r.boolean("tiers.pmem.enabled", &c.pmem_enabled);
  r.string("tiers.pmem.path", &c.pmem_path);
  r.size("tiers.pmem.capacity", &c.pmem_capacity);
  r.boolean("tiers.vram.enabled", &c.vram_enabled);
  r.boolean("tiers.vram.required", &c.vram_required);
  r.integer("tiers.vram.device", &c.vram_device, 0, 1023);
  r.size("tiers.vram.capacity", &c.vram_capacity);
  r.boolean("tiers.vram.pin_dram", &c.vram_pin_dram);
  r.string("log.level", &c.log_level);
  r.integer("tenants.max_per_node", &c.max_tenants_per_node, 1, 1024);
  r.string("tenants.admin_group", &c.admin_group);
  r.boolean("tenants.refuse_unlisted", &c.unlisted_refused);
  for (Tier t : k_tiers_fastest_first) {
    r.size("tenants.default_quota_" + std::string(tier_name(t)), &c.default_quota[static_cast<size_t>(t)]);
  }
  r.integer("recovery.stale_writer_grace_ms", &c.stale_writer_grace_ms, 0, 600000);
  r.integer("lease.grace_ms", &c.lease_grace_ms, 0, 3600000);
  r.boolean("metadata.enabled", &c.metadata_enabled);
  r.string("metadata.path", &c.metadata_path);
  r.integer("metadata.max_allocations", &c.metadata_max_allocations, 1, 1 << 24);
  r.string("cluster.file", &c.cluster_file);
  r.string("cluster.listen", &c.cluster_listen);
  r.integer("cluster.reconnect_interval_ms", &c.reconnect_interval_ms, 10, 600000);
  r.integer("cluster.heartbeat_interval_ms", &c.heartbeat_interval_ms, 10, 600000);
  r.integer("cluster.peer_timeout_ms", &c.peer_timeout_ms, 10, 600000);
  r.integer("health.degraded_after_missed", &c.health_degraded_after_missed, 1, 1000);
  r.integer("health.unreachable_after_ms", &c.health_unreachable_after_ms, 1, 3600000);
  r.integer("replication.drop_after_ms", &c.replication_drop_after_ms, 0, 3600000);
  r.integer("replication.repair_interval_ms", &c.replication_repair_interval_ms, 10, 600000);
  r.integer("replication.orphan_min_age_ms", &c.replication_orphan_min_age_ms, 0, 3600000);
  r.boolean("demotion.enabled", &c.demotion_enabled);
  r.integer("demotion.high_water_percent", &c.demotion_high_water_percent, 1, 100);
  r.integer("demotion.low_water_percent", &c.demotion_low_water_percent, 0, 99);
  r.integer("demotion.interval_ms", &c.demotion_interval_ms, 10, 3600000);
  r.string("cluster.secret_file", &c.secret_file);
  r.string("transport.fabric", &c.transport_fabric);
  r.string("transport.provider", &c.transport_provider);
  r.string("transport.tls", &c.transport_tls);
  r.string("transport.devices", &c.transport_devices);
  r.integer("transport.keepalive_interval_ms", &c.transport_keepalive_interval_ms, 0, 3600000);
  r.integer("transport.timeout_ms", &c.transport_timeout_ms, 10, 3600000);
  r.boolean("metrics.enabled", &c.metrics_enabled);
  r.string("metrics.listen", &c.metrics_listen);
}

}  // namespace

std::string metadata_pool_path(const DaemonConfig& c) {
  if (!c.metadata_path.empty()) return c.metadata_path;
  return (c.pmem_enabled ? c.pmem_path : c.dram_path) + "/metadata.pool";
}

Result<DaemonConfig> load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return Status(ErrorCode::config_error,
                  "cannot read config file " + path + " (does it exist and is it readable?)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

}  // namespace tiermem
