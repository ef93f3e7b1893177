// Who a client is (O5): the tenant its memory belongs to, from the Unix peer
// credentials of its connection (uid, primary and supplementary groups), and
// whether it is an operator (uid 0, or a member of tenants.admin_group), who
// may act on every tenant's memory. Tenants and their quotas come from the
// configuration ([[tenant]]); a uid in none is a tenant of its own, "uid:N",
// unless tenants.refuse_unlisted says to refuse it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <tiermem/status.h>

#include "daemon/config.hpp"
#include "mapping/address_space.hpp"

namespace tiermem {

struct Identity {
  std::string tenant;
  bool is_operator = false;
  uint32_t uid = 0;
  // A peer daemon that acts as the home of a copy this request is about
  // (Request.by_home, believed from an authenticated peer only); 0: none.
  NodeId acting_home = 0;
  // "tenant 'alice' (uid 1000)" for messages.
  std::string describe() const;
};

class TenantMap {
 public:
  // Resolves tenants.admin_group (a group name or number) now. Errors:
  // config_error (no such group).
  static Result<TenantMap> create(const DaemonConfig& config);

  // Errors: permission_denied (a uid in no tenant, and unlisted uids are
  // refused), naming the uid and what to configure.
  Result<Identity> identify(uint32_t uid, uint32_t gid, std::span<const uint32_t> groups) const;
  // The quotas of a tenant (default_quota for the daemon's own "uid:N").
  TenantLimits limits(const std::string& tenant) const;

 private:
  const TenantConfig* by_uid(uint32_t uid) const;
  const TenantConfig* by_group(uint32_t gid, std::span<const uint32_t> groups) const;

  std::vector<TenantConfig> m_tenants;
  std::array<uint64_t, 4> m_default_quota{};
  std::optional<uint32_t> m_admin_gid;
  bool m_refuse_unlisted = false;
};

// Supplementary groups of the peer of a Unix socket (SO_PEERGROUPS).
std::vector<uint32_t> peer_groups(int socket);

// A group given by name or number, for configuration key `key` of
// `source`. Errors: config_error naming the key when no such group exists.
Result<uint32_t> resolve_group(const std::string& group, std::string_view key, std::string_view source);

}  // namespace tiermem
