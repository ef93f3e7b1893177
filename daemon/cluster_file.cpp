#include "daemon/cluster_file.hpp"

#include <charconv>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <toml++/toml.h>

namespace tiermem {
namespace {

Status error(std::string_view source, int64_t line, const std::string& why) {
  return Status(ErrorCode::config_error, std::string(source) + ":" + std::to_string(line) + ": " + why);
}

bool is_host_port(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  unsigned port = 0;
  const char* end = s.data() + s.size();
  const auto [at, ec] = std::from_chars(s.data() + colon + 1, end, port);
  // Overflow (a port of 99999999999999999999) is an error, not an exception.
  return ec == std::errc() && at == end && port > 0 && port < 65536;
}

}  // namespace

Result<std::vector<ClusterMember>> parse_cluster(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& err) {
    return error(source, err.source().begin.line, std::string(err.description()));
  }
  for (const auto& [key, node] : root) {
    if (key.str() != "node") return error(source, node.source().begin.line, std::string(key.str()) + " is not a known key (only [[node]] tables)");
  }
  const toml::array* nodes = root["node"].as_array();
  if (nodes == nullptr || nodes->empty()) return error(source, 1, "no [[node]] entries");
  std::vector<ClusterMember> out;
  std::set<NodeId> ids;
  std::map<std::string, NodeId> addresses;
  for (const toml::node& n : *nodes) {
    const toml::table* t = n.as_table();
    const int64_t line = n.source().begin.line;
    if (t == nullptr) return error(source, line, "node entries must be tables");
    for (const auto& [key, value] : *t) {
      if (key.str() != "id" && key.str() != "control") {
        return error(source, value.source().begin.line, "node." + std::string(key.str()) + " is not a known key");
      }
    }
    auto id = (*t)["id"].value<int64_t>();
    auto control = (*t)["control"].value<std::string>();
    if (!id || *id < 1 || *id > 0xffff) return error(source, line, "node.id must be an integer from 1 to 65535");
    if (!control || !is_host_port(*control)) {
      return error(source, line, "node.control must be \"host:port\" (node " + std::to_string(*id) + ")");
    }
    if (!ids.insert(static_cast<NodeId>(*id)).second) {
      return error(source, line, "node " + std::to_string(*id) + " is listed twice");
    }
    // Two nodes at one address: one would answer for the other.
    if (auto [it, fresh] = addresses.emplace(*control, static_cast<NodeId>(*id)); !fresh) {
      return error(source, line, "nodes " + std::to_string(it->second) + " and " + std::to_string(*id) +
                                     " have the same control address " + *control);
    }
    out.push_back({static_cast<NodeId>(*id), *control});
  }
  return out;
}

Result<std::vector<ClusterMember>> load_cluster(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::config_error, "cannot read cluster file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), path);
}

}  // namespace tiermem
