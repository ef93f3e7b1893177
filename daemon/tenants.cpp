#include "daemon/tenants.hpp"

#include <grp.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>

namespace tiermem {

std::string Identity::describe() const {
  return "tenant '" + tenant + "' (uid " + std::to_string(uid) + (is_operator ? ", operator" : "") + ")";
}

Result<TenantMap> TenantMap::create(const DaemonConfig& config) {
  TenantMap map;
  map.m_tenants = config.tenants;
  map.m_default_quota = config.default_quota;
  map.m_refuse_unlisted = config.unlisted_refused;
  if (!config.admin_group.empty()) {
    auto gid = resolve_group(config.admin_group, "tenants.admin_group", config.source);
    if (!gid.ok()) return gid.status();
    map.m_admin_gid = *gid;
  }
  return map;
}

Result<uint32_t> resolve_group(const std::string& g, std::string_view key, std::string_view source) {
  uint32_t gid = 0;
  const auto [end, ec] = std::from_chars(g.data(), g.data() + g.size(), gid);
  if (!g.empty() && ec == std::errc() && end == g.data() + g.size()) return gid;
  if (const group* gr = ::getgrnam(g.c_str())) return static_cast<uint32_t>(gr->gr_gid);
  return Status(ErrorCode::config_error, std::string(source) + ": " + std::string(key) + " = \"" + g +
                                             "\": is not a group on this machine; expected a group's name or "
                                             "number (getent group lists them)");
}

const TenantConfig* TenantMap::by_uid(uint32_t uid) const {
  for (const TenantConfig& t : m_tenants) {
    if (std::find(t.uids.begin(), t.uids.end(), uid) != t.uids.end()) return &t;
  }
  return nullptr;
}

const TenantConfig* TenantMap::by_group(uint32_t gid, std::span<const uint32_t> groups) const {
  for (const TenantConfig& t : m_tenants) {
    for (uint32_t g : t.gids) {
      if (g == gid || std::find(groups.begin(), groups.end(), g) != groups.end()) return &t;
    }
  }
  return nullptr;
}

Result<Identity> TenantMap::identify(uint32_t uid, uint32_t gid, std::span<const uint32_t> groups) const {
  Identity id;
  id.uid = uid;
  id.is_operator = uid == 0 || (m_admin_gid && (gid == *m_admin_gid || std::find(groups.begin(), groups.end(),
                                                                                 *m_admin_gid) != groups.end()));
  const TenantConfig* t = by_uid(uid);
  if (t == nullptr) t = by_group(gid, groups);
  if (t != nullptr) {
    id.tenant = t->name;
    return id;
  }
  if (m_refuse_unlisted && !id.is_operator) {
    return Status(ErrorCode::permission_denied, "uid " + std::to_string(uid) +
                                                    " belongs to no tenant of this tiermemd, and unlisted users are "
                                                    "refused (add it to a [[tenant]] in tiermemd.toml)");
  }
  id.tenant = "uid:" + std::to_string(uid);
  return id;
}

TenantLimits TenantMap::limits(const std::string& tenant) const {
  TenantLimits l;
  for (const TenantConfig& t : m_tenants) {
    if (t.name == tenant) {
      l.bytes = t.quota;
      return l;
    }
  }
  l.bytes = m_default_quota;
  return l;
}

std::vector<uint32_t> peer_groups(int socket) {
  std::vector<gid_t> groups(64);
  socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (::getsockopt(socket, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno != ERANGE) return {};
    groups.resize(len / sizeof(gid_t));
    if (::getsockopt(socket, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) return {};
  }
  groups.resize(len / sizeof(gid_t));
  return {groups.begin(), groups.end()};
}

}  // namespace tiermem
