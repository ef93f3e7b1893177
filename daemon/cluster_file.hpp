// The cluster file (C4): which nodes exist and where their daemons listen, as
// an HPC scheduler would generate it. See config/cluster.example.toml.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

namespace tiermem {

struct ClusterMember {
  NodeId id = 0;
  std::string control;  // host:port of the daemon's peer listener
};

// Errors: config_error naming the file and line (syntax, missing or duplicate
// ids, an address that is not host:port).
Result<std::vector<ClusterMember>> parse_cluster(std::string_view text, std::string_view source);
Result<std::vector<ClusterMember>> load_cluster(const std::string& path);

}  // namespace tiermem
