// Checks of a configuration against this machine (O2): what parse_config
// cannot see from the text alone, but a start would trip over. One function
// for `tiermemd --check-config` and for the start, which calls it before it
// opens anything: a file that passes the check does not then fail to start
// for a reason the check could have seen.
//
// What it checks needs no daemon running and changes nothing: files and
// directories named by the configuration (their kind and mode), groups,
// network devices, the UCX transport names, whether a CUDA device exists.
// (The fabric's keys are checked by parse_config: they need no machine.)
// What depends on the running system (another daemon holding a directory,
// permissions as the daemon's user, a GPU's free memory, UCX starting on
// the devices) only a start can find out; checks_left_to_start() says what.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "daemon/config.hpp"

namespace tiermem {

struct ConfigCheck {
  // One config_error per problem, each naming the file, the key, its value
  // and what is expected. Empty: the start would not refuse the file for
  // anything checked here.
  std::vector<Status> problems;
  // What the start will do that the operator may not expect (e.g. the VRAM
  // tier left out: no GPU here). Not problems.
  std::vector<std::string> notes;
};

// Checks `config` on this machine; `peers` is the number of other members of
// its cluster (0: alone). Thread-compatible; may load the CUDA driver (when
// the VRAM tier is enabled) and read /etc/group, /sys/class/net and
// /sys/class/infiniband.
ConfigCheck check_config_here(const DaemonConfig& config, size_t peers);

// What only a start can check for this configuration, one line each.
std::vector<std::string> checks_left_to_start(const DaemonConfig& config, size_t peers);

// The transport names UCX 1.13 knows (transports and their aliases), and
// the check of a UCX_TLS list: comma-separated names, all of them optionally
// excluded by a leading '^', or "all". Errors: config_error naming the file,
// transport.tls, the value, the unknown name and the valid ones.
const std::vector<std::string>& ucx_transport_names();
Status check_transport_names(const std::string& tls, const std::string& source);

// The status of a data plane that did not start, told in the keys of the
// configuration that chose its fabric, transports and devices (the fabric's
// own words kept); `failed` unchanged for UCX when neither tls nor devices
// is set.
Status explain_transport_failure(const DaemonConfig& config, const Status& failed);

}  // namespace tiermem
