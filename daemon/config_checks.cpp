#include "daemon/config_checks.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <set>

#include "common/cuda_driver.hpp"
#include "common/file_kind.hpp"
#include "daemon/peer_auth.hpp"
#include "daemon/tenants.hpp"
#include "tiermem_config.h"

namespace tiermem {
namespace {

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

// "<file>: <key> = <value>: <why>", the form of every problem found here.
Status bad(const DaemonConfig& c, std::string_view key, const std::string& value, const std::string& why) {
  return Status(ErrorCode::config_error, c.source + ": " + std::string(key) + " = " + value + ": " + why);
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = list.find(',', at);
    out.push_back(list.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

struct Existing {
  std::string path;
  struct stat st {};
};

// `path` itself when it exists, else its nearest ancestor that does: what
// decides whether a file or directory can be made there. Empty when not
// even the root can be looked at.
std::optional<Existing> nearest_existing(const std::string& path) {
  std::filesystem::path at = path.empty() ? "." : path;
  for (;;) {
    Existing e{at.string()};
    if (::stat(e.path.c_str(), &e.st) == 0) return e;
    // ENOTDIR: an ancestor is a file; going up finds it.
    if (errno != ENOENT && errno != ENOTDIR) return std::nullopt;
    if (!at.has_relative_path()) return std::nullopt;
    at = at.has_parent_path() && at.parent_path() != at ? at.parent_path() : std::filesystem::path(".");
  }
}

// A directory the daemon makes when missing (and locks): it must be one,
// or be makeable.
void check_directory(const DaemonConfig& c, std::string_view key, const std::string& dir, const std::string& what,
                     ConfigCheck* out) {
  const auto e = nearest_existing(dir);
  if (!e || S_ISDIR(e->st.st_mode)) return;
  if (e->path == dir) {
    out->problems.push_back(bad(c, key, quoted(dir),
                                "is " + file_kind(e->st.st_mode) + ", not a directory; expected a directory for " +
                                    what + " (made when missing)"));
  } else {
    out->problems.push_back(bad(c, key, quoted(dir),
                                e->path + " is " + file_kind(e->st.st_mode) +
                                    ", so the directory cannot be made; expected a directory for " + what +
                                    ", or a path where one can be made"));
  }
}

// The control socket: a free path, or a socket an earlier daemon left
// (whether one still listens there only a start can tell), in a directory
// that is or can be made.
void check_socket(const DaemonConfig& c, ConfigCheck* out) {
  const std::string& path = c.socket_path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISSOCK(st.st_mode)) return;
    out->problems.push_back(bad(c, "control.socket", quoted(path),
                                "is " + file_kind(st.st_mode) +
                                    ", not a socket, and the daemon replaces nothing else; expected a free path or "
                                    "a socket an earlier tiermemd left"));
    return;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const auto e = nearest_existing(dir);
  if (!e || S_ISDIR(e->st.st_mode)) return;
  out->problems.push_back(bad(c, "control.socket", quoted(path),
                              e->path + " is " + file_kind(e->st.st_mode) +
                                  ", not a directory, so the socket cannot be made there; expected a path in a "
                                  "directory (or where one can be made)"));
}

// The metadata pool: a file (or device DAX) the daemon makes when missing,
// in a directory that exists or is one of the tiers' (made at start).
void check_metadata(const DaemonConfig& c, ConfigCheck* out) {
  if (!c.metadata_enabled) return;
  const std::string path = metadata_pool_path(c);
  const std::string value = quoted(path) + (c.metadata_path.empty() ? " (its default)" : "");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      out->problems.push_back(bad(c, "metadata.path", value,
                                  "is a directory; expected the pool's file (such as " + path +
                                      "/metadata.pool), which the daemon makes when missing"));
    } else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode)) {
      out->problems.push_back(bad(c, "metadata.path", value,
                                  "is " + file_kind(st.st_mode) +
                                      "; expected the pool's file (made when missing) or a device DAX"));
    }
    return;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if ((c.pmem_enabled && dir == c.pmem_path) || dir == c.dram_path) return;  // made at start, checked as a tier's
  const auto e = nearest_existing(dir);
  if (!e) return;
  if (!S_ISDIR(e->st.st_mode)) {
    out->problems.push_back(bad(c, "metadata.path", value,
                                e->path + " is " + file_kind(e->st.st_mode) +
                                    ", not a directory; expected a pool file in a directory"));
  } else if (e->path != dir) {
    out->problems.push_back(bad(c, "metadata.path", value,
                                "its directory " + dir +
                                    " does not exist, and the daemon makes the pool but not its directory; expected "
                                    "an existing directory (mkdir -p " + dir + ")"));
  }
}

void check_secret(const DaemonConfig& c, size_t peers, ConfigCheck* out) {
  if (c.secret_file.empty()) {
    if (peers > 0) {
      out->problems.push_back(Status(
          ErrorCode::config_error,
          c.source + ": cluster.secret_file is not set, and a daemon with peers needs it; expected the same secret "
                     "on every node, mode 0600 (head -c 32 /dev/urandom | base64 > /etc/tiermem/cluster.secret; "
                     "chmod 600 /etc/tiermem/cluster.secret)"));
    }
    return;
  }
  // Also without peers: a secret that others can read is a leak already.
  if (auto secret = ClusterSecret::load(c.secret_file, c.source); !secret.ok()) out->problems.push_back(secret.status());
}

#if TIERMEM_HAVE_CUDA
// How many CUDA devices the driver shows (0 with `why` when none can be used).
int cuda_devices(const cuda::Driver** driver, std::string* why) {
  *driver = cuda::load_driver(why);
  if (*driver == nullptr) return 0;
  int count = 0;
  if (const cuda::CUresult r = (*driver)->device_get_count(&count); r != cuda::k_success) {
    *why = "cuDeviceGetCount: " + (*driver)->error(r);
    return 0;
  }
  if (count == 0) *why = "the CUDA driver sees no device";
  return count;
}

// Whether the device has what the VRAM tier needs (virtual memory
// management, with file-descriptor export); empty when it does.
std::string missing_vmm(const cuda::Driver& d, int ordinal) {
  cuda::CUdevice device = 0;
  int vmm = 0, fds = 0;
  cuda::CUresult r = d.device_get(&device, ordinal);
  if (r == cuda::k_success) r = d.device_get_attribute(&vmm, cuda::k_device_vmm_supported, device);
  if (r == cuda::k_success) r = d.device_get_attribute(&fds, cuda::k_device_posix_fd_supported, device);
  if (r != cuda::k_success) return "asking CUDA device " + std::to_string(ordinal) + ": " + d.error(r);
  if (vmm == 0 || fds == 0) {
    return "CUDA device " + std::to_string(ordinal) +
           " has no virtual memory management with file-descriptor export, which the VRAM tier needs";
  }
  return "";
}
#endif

// The VRAM tier without what it needs: refused when required, else a note
// (the start leaves the tier out).
void vram_unusable(const DaemonConfig& c, const std::string& why, ConfigCheck* out) {
  if (c.vram_required) {
    out->problems.push_back(bad(c, "tiers.vram.required", "true",
                                "no GPU the daemon can use here (" + why +
                                    "); expected a machine with a CUDA GPU and its driver, or required = false to "
                                    "run without the VRAM tier"));
  } else {
    out->notes.push_back("the VRAM tier will be left out: " + why);
  }
}

// The driver is looked up at run time (common/cuda_driver): this needs no
// CUDA at build time beyond knowing whether the tier was built.
void check_vram(const DaemonConfig& c, ConfigCheck* out) {
  if (!c.vram_enabled) return;
#if TIERMEM_HAVE_CUDA
  const cuda::Driver* driver = nullptr;
  std::string why;
  const int count = cuda_devices(&driver, &why);
  if (count == 0) return vram_unusable(c, why, out);
  if (c.vram_device >= count) {
    out->problems.push_back(bad(c, "tiers.vram.device", std::to_string(c.vram_device),
                                "this machine has " + std::to_string(count) + " CUDA device(s); expected 0 to " +
                                    std::to_string(count - 1)));
    return;
  }
  if (std::string missing = missing_vmm(*driver, c.vram_device); !missing.empty()) vram_unusable(c, missing, out);
#else
  vram_unusable(c, "this tiermemd was built without CUDA (rebuild with -Dcuda=enabled where the toolkit is)", out);
#endif
}

// The network devices of this machine, by name (UCX's: interfaces and
// RDMA devices).
std::set<std::string> network_devices() {
  std::set<std::string> names;
  std::error_code ec;
  for (const char* dir : {"/sys/class/net", "/sys/class/infiniband"}) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) names.insert(e.path().filename().string());
  }
  return names;
}

// One entry of a UCX_NET_DEVICES list ("eth0", "mlx5_0:1"); empty when it
// names a device (and port) of this machine, else why not.
std::string unknown_device(const std::string& entry, const std::set<std::string>& devices) {
  const size_t colon = entry.find(':');
  const std::string name = entry.substr(0, colon);
  if (name.empty()) return "an empty device name";
  if (devices.count(name) == 0) return "no device " + name + " on this machine";
  if (colon == std::string::npos) return "";
  const std::string port = entry.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) {
    return "'" + port + "' after " + name + ": is not a port number";
  }
  std::error_code ec;
  const std::string ib = "/sys/class/infiniband/" + name;
  if (std::filesystem::exists(ib, ec) && !std::filesystem::exists(ib + "/ports/" + port, ec)) {
    return "RDMA device " + name + " has no port " + port;
  }
  return "";
}

void check_devices(const DaemonConfig& c, ConfigCheck* out) {
  const std::string& value = c.transport_devices;
  if (value.empty() || value == "all") return;
  const std::set<std::string> devices = network_devices();
  for (const std::string& entry : split(value[0] == '^' ? value.substr(1) : value)) {
    const std::string why = unknown_device(entry, devices);
    if (why.empty()) continue;
    out->problems.push_back(bad(c, "transport.devices", quoted(value),
                                why + "; expected \"all\" or a comma-separated list of this machine's devices (" +
                                    joined(std::vector<std::string>(devices.begin(), devices.end())) +
                                    ": /sys/class/net, /sys/class/infiniband), an RDMA one optionally with :port, "
                                    "all of them optionally excluded by a leading ^"));
    return;
  }
}

}  // namespace

const std::vector<std::string>& ucx_transport_names() {
  // UCX 1.13's transports (uct) and the aliases ucp_context.c expands.
  static const std::vector<std::string> k_names = {
      "self", "tcp", "posix", "sysv", "xpmem", "knem", "cma", "rc_verbs", "ud_verbs", "rc_mlx5", "ud_mlx5",
      "dc_mlx5", "cuda_copy", "cuda_ipc", "gdr_copy", "rocm_copy", "rocm_ipc", "rocm_gdr", "ugni_smsg", "ugni_udt",
      "ugni_rdma", "mm", "sm", "shm", "ib", "ud_v", "ud_x", "ud", "rc_v", "rc_x", "rc", "dc", "dc_x", "ugni", "cuda",
      "rocm"};
  return k_names;
}

Status check_transport_names(const std::string& tls, const std::string& source) {
  if (tls.empty() || tls == "all") return Status();
  const auto& names = ucx_transport_names();
  for (const std::string& name : split(tls[0] == '^' ? tls.substr(1) : tls)) {
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    return Status(ErrorCode::config_error,
                  source + ": transport.tls = " + quoted(tls) + ": " +
                      (name.empty() ? std::string("an empty transport name") : "UCX knows no transport '" + name + "'") +
                      "; expected \"all\" or a comma-separated list of " + joined(names) +
                      ", all of them optionally excluded by a leading ^ (ucx_info -d lists those usable here)");
  }
  return Status();
}

ConfigCheck check_config_here(const DaemonConfig& c, size_t peers) {
  ConfigCheck out;
  check_socket(c, &out);
  check_directory(c, "tiers.dram.path", c.dram_path, "the node's shared memory", &out);
  if (c.pmem_enabled) check_directory(c, "tiers.pmem.path", c.pmem_path, "the PMEM pools", &out);
  check_metadata(c, &out);
  check_vram(c, &out);
  if (!c.admin_group.empty()) {
    if (auto gid = resolve_group(c.admin_group, "tenants.admin_group", c.source); !gid.ok()) {
      out.problems.push_back(gid.status());
    }
  }
  check_secret(c, peers, &out);
  if (Status s = check_transport_names(c.transport_tls, c.source); !s.ok()) out.problems.push_back(s);
  check_devices(c, &out);
  return out;
}

std::vector<std::string> checks_left_to_start(const DaemonConfig& c, size_t peers) {
  std::vector<std::string> out;
  std::string held = "tiers.dram.path " + c.dram_path;
  if (c.pmem_enabled) held += ", tiers.pmem.path " + c.pmem_path;
  if (c.metadata_enabled) held += ", the metadata pool " + metadata_pool_path(c);
  out.push_back("that no other tiermemd holds " + held + " or serves on control.socket " + c.socket_path);
  out.push_back("that the daemon's user may make, lock and write them (permissions are those of who starts it)");
  if (c.metadata_enabled) {
    out.push_back("that the metadata pool opens and was made for this configuration (page size, capacities, "
                  "tenants per node)");
  }
  if (c.transport_fabric == "libfabric") {
    out.push_back("that libfabric's provider " + quoted(c.transport_provider) +
                  " (transport.provider) starts on this machine's devices with what tiermem needs of it");
  } else {
    std::string ucx = "that UCX starts on this machine's devices";
    if (!c.transport_tls.empty()) ucx += " with transport.tls = " + quoted(c.transport_tls);
    if (!c.transport_devices.empty()) ucx += " with transport.devices = " + quoted(c.transport_devices);
    out.push_back(ucx);
  }
  if (c.vram_enabled) {
    out.push_back("that the CUDA runtime works with the driver, and that the GPU has the memory "
                  "tiers.vram.capacity asks");
  }
  if (peers > 0) out.push_back("that the peers' address can be listened on and the peers know the same secret");
  if (!c.metrics_listen.empty()) out.push_back("that metrics.listen " + c.metrics_listen + " can be listened on");
  return out;
}

Status explain_transport_failure(const DaemonConfig& c, const Status& failed) {
  if (!failed.ok() && c.transport_fabric == "libfabric") {
    return Status(failed.code(), c.source + ": transport.fabric = \"libfabric\" with transport.provider = " +
                                     quoted(c.transport_provider) + ": the data plane could not start (" +
                                     failed.message() +
                                     "); expected a provider this build and machine have (fi_info -p NAME shows "
                                     "one), or fabric = \"ucx\"");
  }
  if (failed.ok() || (c.transport_tls.empty() && c.transport_devices.empty())) return failed;
  std::string keys;
  if (!c.transport_tls.empty()) keys = "transport.tls = " + quoted(c.transport_tls);
  if (!c.transport_devices.empty()) {
    keys += (keys.empty() ? "" : " with ") + std::string("transport.devices = ") + quoted(c.transport_devices);
  }
  const bool both = !c.transport_tls.empty() && !c.transport_devices.empty();
  return Status(failed.code(), c.source + ": " + keys + ": UCX could not start with " + (both ? "these" : "this") +
                                   " (" + failed.message() +
                                   "); expected transports usable on this machine's devices (ucx_info -d lists "
                                   "them), or the keys left empty for UCX's own choice");
}

}  // namespace tiermem
