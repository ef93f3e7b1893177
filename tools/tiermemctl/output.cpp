#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <utility>

#include "common/file_kind.hpp"
#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {

namespace {

bool g_json_errors = false;

// The client library's default (include/tiermem/client.h).
constexpr const char* k_default_socket = "/run/tiermem/tiermemd.sock";

// The socket the client library will connect to, and what chose it.
std::pair<std::string, std::string> socket_of(const Context& ctx) {
  if (!ctx.socket.empty()) return {ctx.socket, "from --socket"};
  if (const char* env = std::getenv("TIERMEM_SOCKET"); env != nullptr && *env != '\0') {
    return {env, "from $TIERMEM_SOCKET"};
  }
  return {k_default_socket, "the default"};
}

// Why no tiermemd can be at `path`, or "" when one may be. Said before
// connecting: connect(2) says "Connection refused" to a regular file.
std::string no_daemon_at(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return "";  // connect says (permission denied, ...)
    return "it does not exist: is tiermemd running, and with control.socket = \"" + path +
           "\"? (systemctl status tiermemd; its log names the socket it serves on)";
  }
  if (S_ISSOCK(st.st_mode)) return "";
  return path + " is not a socket (" + file_kind(st.st_mode) +
         "), so no tiermemd serves there: give tiermemctl the control.socket of tiermemd's configuration (--socket "
         "or $TIERMEM_SOCKET; default " + k_default_socket + ")";
}

}  // namespace

void set_json_errors(bool json) { g_json_errors = json; }

int fail(const std::string& what, const Status& status) {
  if (g_json_errors) {
    print_json({{"error",
                 {{"what", what}, {"code", std::string(error_code_name(status.code()))}, {"message", status.message()}}}});
  } else {
    std::fprintf(stderr, "tiermemctl: %s: %s\n", what.c_str(), status.to_string().c_str());
  }
  return k_exit_failed;
}

int usage_error(const std::string& message) {
  if (g_json_errors) {
    print_json({{"error", {{"what", "usage"}, {"code", "invalid_argument"}, {"message", message}}}});
  } else {
    std::fprintf(stderr, "tiermemctl: %s\n", message.c_str());
  }
  return k_exit_usage;
}

std::unique_ptr<Client> connect(const Context& ctx) {
  const auto [path, origin] = socket_of(ctx);
  if (const std::string why = no_daemon_at(path); !why.empty()) {
    fail("connect", Status(ErrorCode::connection_failed,
                           "cannot connect to tiermemd at " + path + " (" + origin + "): " + why));
    return nullptr;
  }
  auto client = Client::connect({.socket_path = ctx.socket, .client_name = "tiermemctl"});
  if (!client.ok()) {
    fail("connect", client.status());
    return nullptr;
  }
  return std::move(client).value();
}

std::string Table::render() const {
  std::vector<size_t> widths;
  for (const auto& row : m_rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : m_rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

// Names are the users': bytes that are not UTF-8 are shown replaced, never
// thrown at (nlohmann's default).
void print_json(const nlohmann::json& value) {
  std::cout << value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

Result<uint64_t> room_at(Client& client, Gva gva) {
  auto t = client.translate(gva);
  if (!t.ok()) return t.status();
  return t->allocation.size - std::min(t->offset_in_allocation, t->allocation.size);
}

nlohmann::json to_json(const AllocationInfo& a) {
  nlohmann::json copies = nlohmann::json::array();
  for (const ReplicaInfo& r : a.replicas) {
    copies.push_back({{"node", r.node}, {"gva", r.gva.to_string()}, {"state", replica_state_name(r.state)}});
  }
  nlohmann::json j = {{"gva", a.gva.to_string()},
          {"generation", a.gva.generation},
          {"size", a.size},
          {"tier", tier_name(a.tier)},
          {"name", a.name},
          {"pages", a.pages},
          {"slot_bytes", a.slot_bytes},
          {"map_count", a.map_count},
          {"created_unix_ms", a.created_unix_ms},
          {"owner_uid", a.owner_uid},
          {"tenant", a.tenant},
          {"lost_pages", a.lost_pages},
          {"torn_pages", a.torn_pages},
          {"qos", qos_class_name(a.qos)},
          {"demotable", a.demotable},
          {"replicas_wanted", a.replicas_wanted},
          {"replicas", copies}};
  if (a.replica_of.node != 0) {
    j["replica_of"] = a.replica_of.to_string();
    j["replica_ready"] = a.replica_ready;
  }
  return j;
}

nlohmann::json to_json(const TierStat& t) {
  return {{"tier", tier_name(t.tier)},       {"capacity_bytes", t.capacity_bytes},
          {"used_bytes", t.used_bytes},      {"free_bytes", t.free_bytes},
          {"persistent", t.persistent},      {"shareable", t.shareable},
          {"backing", t.backing},            {"allocations", t.allocations}};
}

nlohmann::json to_json(const PageInfo& p, uint64_t page_size, NodeId home) {
  Gva gva;
  gva.node = home;
  gva.offset = p.page_index * page_size;
  return {{"page", p.page_index},
          {"gva", gva.to_string()},
          {"tier", tier_name(p.tier)},
          {"node", p.node},
          {"frame_offset", p.frame_offset},
          {"flags", page_flags_text(p.flags)},
          {"version", p.version},
          {"epoch", p.epoch},
          {"sequence", p.sequence},
          {"locked", p.locked},
          {"exclusive_pending", p.exclusive_pending},
          {"valid_mask", hex(p.valid_mask)},
          {"dirty_mask", hex(p.dirty_mask)}};
}

nlohmann::json to_json(const Extent& x) {
  return {{"tier", tier_name(x.tier)},
          {"node", x.node},
          {"frame_offset", x.frame_offset},
          {"gva_offset", x.gva_offset},
          {"length", x.length}};
}

std::string hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string percent(uint64_t part, uint64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string age(uint64_t ms) {
  char buf[32];
  const uint64_t s = ms / 1000;
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%llum%02llus", static_cast<unsigned long long>(s / 60), static_cast<unsigned long long>(s % 60));
  else std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(s / 3600), static_cast<unsigned long long>(s / 60 % 60));
  return buf;
}

std::string version_text(const PageInfo& p) {
  return std::to_string(p.epoch) + "." + std::to_string(p.sequence) + (p.locked ? " (locked)" : "") +
         (p.exclusive_pending ? " (wanted by the daemon)" : "");
}

}  // namespace tiermem::ctl
