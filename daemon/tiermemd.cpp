// tiermemd: the per-node tiermem daemon.
//
// Start-up, in order: configuration and cluster file, and the checks of them
// on this machine that --check-config makes too (exit 2 when bad); the
// directories of the node's memory, each locked so that no second daemon
// shares them; what an earlier daemon left there is retired (its clients
// stop using it); tiers, address space and data plane; tenants and the
// cluster secret; peers; the control server. Then serve until SIGTERM.
#include <utility>  // before Asio (Boost 1.74 with C++20)
#include <netdb.h>

#include <signal.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli_man.hpp"
#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/log.hpp"
#include "common/malloc_tuning.hpp"
#include "common/random.hpp"
#include "daemon/cluster_file.hpp"
#include "daemon/config.hpp"
#include "daemon/config_checks.hpp"
#include "daemon/control_server.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/metrics_server.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/request_handler.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"
#include "tiers/segment_file.hpp"
#include "tiers/truncation_guard.hpp"
#include "mapping/version_segments.hpp"
#include "tiermem_config.h"

namespace {

// The IP address of this node's control address (host:port in the cluster
// file), where its data plane listens too; empty without a cluster or when
// the name does not resolve (then the data plane does not listen).
std::string listen_ip_of(const std::string& control) {
  const size_t colon = control.rfind(':');
  if (control.empty() || colon == std::string::npos || colon == 0) return "";
  std::string host = control.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "";
  char ip[NI_MAXHOST] = {};
  const int rc = ::getnameinfo(found->ai_addr, found->ai_addrlen, ip, sizeof ip, nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(found);
  return rc == 0 ? ip : "";
}

using namespace tiermem;
namespace asio = boost::asio;

constexpr const char* k_default_config = "/etc/tiermem/tiermemd.toml";
constexpr unsigned k_io_threads = 2;
// Blocking work (forwarded requests, remote copies, migrations) runs here.
// A peer gets at most a quarter of the threads at once for its requests,
// and an eighth more for callers on the pool waiting for one of those
// (forwarded requests wait without a thread), so a stopped peer leaves the
// rest to requests that go elsewhere.
constexpr unsigned k_pool_threads = 32;

// This node's control address in the cluster file, and every member.
Result<std::vector<ClusterMember>> load_members(const DaemonConfig& config, std::string* control) {
  if (config.cluster_file.empty()) return std::vector<ClusterMember>{};
  TIERMEM_ASSIGN_OR_RETURN(auto members, load_cluster(config.cluster_file));
  for (const ClusterMember& m : members) {
    if (m.id == config.node_id) *control = m.control;
  }
  if (control->empty()) {
    return Status(ErrorCode::config_error, "node " + std::to_string(config.node_id) + " is not in cluster file " +
                                               config.cluster_file);
  }
  return members;
}

void remove_memory(const DaemonConfig& c, bool retire);

// Everything a serving daemon holds, built in start-up order and torn down in
// reverse; the node's memory files go last, while the directories are still
// locked.
struct Node {
  explicit Node(const DaemonConfig& c) : config(c) {}
  ~Node() {
    peers.reset();
    space.reset();
    data_plane.reset();
    // Without durable metadata nothing recovers the memory: it goes. With
    // it, the files stay for the next daemon, retired so that no client
    // writes into them meanwhile.
    if (!dram_lock.dir().empty()) {
      if (config.metadata_enabled) {
        (void)VersionSegments::retire_stale(config.dram_path, std::chrono::milliseconds(0), false);
      } else {
        remove_memory(config, true);
      }
    }
  }
  const DaemonConfig& config;
  std::string control;  // this node's address for peers ("" alone)
  std::vector<ClusterMember> members;
  uint64_t incarnation = random_nonzero();
  DirectoryLock dram_lock, pmem_lock;
  std::unique_ptr<DataPlane> data_plane;
  std::unique_ptr<AddressSpace> space;
  std::optional<TenantMap> tenants;
  ClusterSecret secret;
  std::unique_ptr<PeerManager> peers;
};

// The memory directories: locked (one daemon each). What an earlier daemon
// left there is retired first (its version segments say incarnation 0, and
// its clients' page locks are waited for), so a client still connected to
// it writes nothing more. With durable metadata the files stay, for
// AddressSpace to take over; without, they go.
Status take_directories(const DaemonConfig& c, Node* node) {
  TIERMEM_ASSIGN_OR_RETURN(node->dram_lock, DirectoryLock::take(c.dram_path, "the node's shared memory"));
  const bool keep = c.metadata_enabled;
  const auto retired =
      VersionSegments::retire_stale(c.dram_path, std::chrono::milliseconds(c.stale_writer_grace_ms), !keep);
  if (retired.segments > 0) {
    spdlog::info("retired {} version segment(s) of an earlier daemon in {}{}", retired.segments, c.dram_path,
                 retired.locked_pages > 0
                     ? "; " + std::to_string(retired.locked_pages) + " page(s) were still locked by its clients"
                     : "");
  }
  if (c.pmem_enabled) {
    TIERMEM_ASSIGN_OR_RETURN(node->pmem_lock, DirectoryLock::take(c.pmem_path, "the PMEM pool"));
  }
  if (!keep) remove_memory(c, false);
  return Status();
}

Result<TierSet> open_tiers(const DaemonConfig& c) {
  TierSet tiers;
  if (c.vram_enabled) {
    auto vram = make_vram_tier(c.vram_device, c.vram_capacity, c.max_tenants_per_node);
    if (vram.ok()) {
      tiers[static_cast<size_t>(Tier::vram)] = std::move(vram).value();
    } else if (c.vram_required || (vram.status().code() != ErrorCode::tier_unavailable &&
                                     vram.status().code() != ErrorCode::not_supported)) {
      return vram.status().with_context("VRAM tier");
    } else {
      spdlog::info("VRAM tier off: {}", vram.status().message());
    }
  }
  if (c.dram_enabled) {
    TIERMEM_ASSIGN_OR_RETURN(tiers[static_cast<size_t>(Tier::dram)],
                             make_dram_tier({c.dram_path, c.dram_capacity, c.max_tenants_per_node}));
  }
  if (c.pmem_enabled) {
    TIERMEM_ASSIGN_OR_RETURN(tiers[static_cast<size_t>(Tier::pmem)],
                             make_pmem_tier({c.pmem_path, c.pmem_capacity, c.max_tenants_per_node}));
  }
  TierBackend* vram = tiers[static_cast<size_t>(Tier::vram)].get();
  TierBackend* dram = tiers[static_cast<size_t>(Tier::dram)].get();
  if (vram != nullptr && dram != nullptr && c.vram_pin_dram) dram->pin_with(vram->host_pinner());
  return tiers;
}

void log_tiers(const AddressSpace& space) {
  for (const TierStat& t : space.tier_stats()) {
    spdlog::info("tier {}: {} on {}{}", tier_name(t.tier), format_size(t.capacity_bytes), t.backing,
                 t.persistent ? " (persistent)" : "");
  }
}

void log_recovery(const AddressSpace& space) {
  const RecoveryReport& r = space.recovery();
  if (!r.from_metadata) {
    spdlog::info("no durable metadata (metadata.enabled = false): allocations end with this daemon");
    return;
  }
  if (r.pool_created) {
    spdlog::info("metadata pool {} made: a new node", r.pool);
    return;
  }
  spdlog::info("recovered {} allocation(s), {} page(s), from {} in {:.1f} ms (start {} on it); shared memory {}; "
               "{} frame(s) still lent to peers",
               r.allocations, r.pages, r.pool, r.elapsed_ms, r.starts,
               r.memory_adopted ? "taken over" : "made anew for some tenants (their DRAM contents are gone)",
               r.lent_frames);
  for (const TenantNote& d : r.domains_made_anew) spdlog::error("shared memory made anew: {}", d.text);
  if (r.lost_allocations > 0) {
    spdlog::error("{} allocation(s) lost {} page(s) whose memory did not survive; reads of them fail with data_lost:",
                  r.lost_allocations, r.lost_pages);
    for (const TenantNote& l : r.lost) spdlog::error("  lost: {}", l.text);
  }
  if (r.locks_broken > 0) {
    spdlog::warn("{} page(s) were still locked by writers of the daemon before: flagged torn (T)", r.locks_broken);
  }
  for (const std::string& d : r.dropped_reasons) spdlog::error("metadata record dropped: {}", d);
}

Status open_memory(const DaemonConfig& c, Node* node) {
  TIERMEM_RETURN_IF_ERROR(take_directories(c, node));
  TIERMEM_ASSIGN_OR_RETURN(auto tiers, open_tiers(c));
  AddressSpaceOptions options;
  options.node = c.node_id;
  options.page_size = c.page_size;
  options.domains = c.max_tenants_per_node;
  options.pages_per_domain = c.pages_per_tenant;
  options.sub_page_max = c.sub_page_bytes();
  options.versions_dir = c.dram_path;
  options.incarnation = node->incarnation;
  if (c.metadata_enabled) {
    options.metadata = MetadataOptions{.path = metadata_pool_path(c), .max_allocations = c.metadata_max_allocations};
  }
  TIERMEM_ASSIGN_OR_RETURN(node->space, AddressSpace::create(options, std::move(tiers)));
  log_tiers(*node->space);
  log_recovery(*node->space);
  return Status();
}

Status open_cluster(const DaemonConfig& c, Node* node) {
  TIERMEM_ASSIGN_OR_RETURN(auto tenants, TenantMap::create(c));
  node->tenants.emplace(std::move(tenants));
  // That a daemon with peers has a secret was checked before anything was
  // opened (check_config_here).
  if (node->members.size() <= 1) return Status();
  TIERMEM_ASSIGN_OR_RETURN(node->secret, ClusterSecret::load(c.secret_file, c.source));
  PeerOptions po;
  po.self = c.node_id;
  po.members = node->members;
  po.reconnect_interval = std::chrono::milliseconds(c.reconnect_interval_ms);
  po.heartbeat_interval = std::chrono::milliseconds(c.heartbeat_interval_ms);
  po.timeout = std::chrono::milliseconds(c.peer_timeout_ms);
  po.degraded_after_missed = c.health_degraded_after_missed;
  po.unreachable_after = std::chrono::milliseconds(c.health_unreachable_after_ms);
  po.max_in_flight = k_pool_threads / 4;
  po.max_blocked_waiters = k_pool_threads / 8;
  DataPlane* dp = node->data_plane.get();
  AddressSpace* space = node->space.get();
  node->peers = std::make_unique<PeerManager>(
      po, [dp] { return dp->self(); }, dp->transport(), node->secret,
      [space](NodeId peer, const PeerManager::MemoryGenerations& generations) {
        if (const size_t lost = space->lose_frames_of(peer, generations); lost > 0) {
          spdlog::error("node {}'s memory was made anew for some tenants: {} page(s) on frames it lent are lost",
                        peer, lost);
        }
      });
  return Status();
}

// Every connection holds descriptors: the soft limit (1024 by default
// outside systemd) up to the hard one, so that the listeners' admission
// budgets, not the descriptors, bound what unproven connections can take.
void raise_file_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= files.rlim_max) return;
  const rlim_t was = files.rlim_cur;
  files.rlim_cur = files.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &files) == 0) {
    spdlog::debug("open files limit raised from {} to {}", was, files.rlim_cur);
  }
}

size_t peers_of(const std::vector<ClusterMember>& members) { return members.empty() ? 0 : members.size() - 1; }

// Builds everything before serving. Returns the process exit code on
// failure (2: configuration, 1: anything else).
int start(const DaemonConfig& config, Node* node) {
  auto members = load_members(config, &node->control);
  if (!members.ok()) {
    spdlog::critical("cannot start: {}", members.status().to_string());
    return 2;
  }
  node->members = std::move(members).value();
  // Before anything is opened, and the same checks as --check-config's: a
  // file that passed them does not fail here for a reason they could see.
  const ConfigCheck checked = check_config_here(config, peers_of(node->members));
  for (const Status& problem : checked.problems) spdlog::critical("cannot start: {}", problem.to_string());
  if (!checked.problems.empty()) return 2;
  raise_file_limit();
  auto dp = DataPlane::start(config, listen_ip_of(node->control));
  Status s = explain_transport_failure(config, dp.status());
  if (s.ok()) node->data_plane = std::move(dp).value();
  if (s.ok()) s = open_memory(config, node);
  if (s.ok()) s = node->data_plane->describe(config, *node->space, node->control, node->incarnation);
  if (s.ok()) s = open_cluster(config, node);
  // On top of UCX's SIGBUS handler (installed with the transport), which
  // it chains to for faults that are not a truncated file's.
  if (s.ok()) s = TruncationGuard::install();
  if (!s.ok()) {
    spdlog::critical("cannot start: {}", s.to_string());
    return s.code() == ErrorCode::config_error ? 2 : 1;
  }
  return 0;
}

// What SIGHUP reloads from: the configuration file, and the log level given
// by flag or environment (which wins over the file's).
struct ReloadSource {
  std::string config_path;
  std::string log_level;
} g_reload;

// SIGHUP (systemctl reload): reads the configuration again and applies what
// can change while serving, the log level; the rest needs a restart, and a
// file that does not load changes nothing.
void reload() {
  sd_notify(0, "RELOADING=1");
  std::string level = g_reload.log_level;
  if (!g_reload.config_path.empty()) {
    auto loaded = load_config(g_reload.config_path);
    if (!loaded.ok()) {
      spdlog::error("SIGHUP: {}; nothing changed", loaded.status().message());
      sd_notify(0, "READY=1");
      return;
    }
    if (level.empty()) level = loaded->log_level;
  }
  if (level.empty()) level = "info";
  // Said at the level in force before: an operator who asked for less sees
  // it once more, one who asked for more sees it after.
  const std::string said = fmt::format("SIGHUP: reloaded {}: log level {}{}",
                                       g_reload.config_path.empty() ? "(built-in defaults)" : g_reload.config_path,
                                       level, g_reload.log_level.empty() ? "" : " (from --log-level or $TIERMEM_LOG_LEVEL)");
  const bool louder = spdlog::level::from_str(level) < spdlog::default_logger()->level();
  if (!louder) spdlog::info("{}", said);
  if (Status s = set_log_level(level); !s.ok()) {
    spdlog::error("SIGHUP: {}; nothing changed", s.message());
  } else if (louder) {
    spdlog::info("{}", said);
  }
  sd_notify(0, "READY=1");
}

void watch_reload(asio::signal_set& hup) {
  hup.async_wait([&hup](const boost::system::error_code& ec, int) {
    if (ec) return;
    reload();
    watch_reload(hup);
  });
}

// Pets the systemd watchdog at half its interval, when the unit asks for one.
void start_watchdog(asio::io_context& io, asio::steady_timer& timer) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  const auto period = std::chrono::microseconds(usec / 2);
  static std::function<void()> pet;
  pet = [&timer, period]() {
    sd_notify(0, "WATCHDOG=1");
    timer.expires_after(period);
    timer.async_wait([](const boost::system::error_code& ec) {
      if (!ec) pet();
    });
  };
  asio::post(io, pet);
}

// Sweeps the clients' check-in edges (logging each transition once) and the
// leases of session allocations, as often as the shortest check-in interval
// asks (at least every 500 ms).
void start_checkin_sweep(asio::steady_timer& timer, RequestHandler& handler) {
  static std::function<void()> sweep;
  sweep = [&timer, &handler]() {
    handler.sweep_leases();
    handler.trim_tenant_files();
    handler.log_admissions();
    timer.expires_after(handler.check_ins().sweep());
    timer.async_wait([](const boost::system::error_code& ec) {
      if (!ec) sweep();
    });
  };
  sweep();
}

int run(const DaemonConfig& config, Node& node, ControlServer& server, asio::io_context& io, RequestHandler& handler) {
  std::unique_ptr<MetricsServer> metrics;
  // Before anything listens: a SIGTERM from then on is a clean shutdown
  // (Asio queues it until the wait below), never the default action.
  asio::signal_set signals(io, SIGINT, SIGTERM), hup(io, SIGHUP);
  if (Status s = server.listen(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.to_string());
    return 1;
  }
  if (!config.metrics_listen.empty()) {
    metrics = std::make_unique<MetricsServer>(io, config.metrics_listen, [&handler] { return handler.metrics(); });
    if (Status s = metrics->listen(); !s.ok()) {
      spdlog::critical("cannot start: {}", s.to_string());
      server.stop();
      return 1;
    }
    metrics->start();
    spdlog::info("metrics on http://{}/metrics", metrics->address());
  }
  server.start();
  if (node.peers) node.peers->start();
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    spdlog::info("received {}, shutting down", signo == SIGTERM ? "SIGTERM" : "SIGINT");
    sd_notify(0, "STOPPING=1");
    // Clients see it in the headers before their connections close.
    node.space->versions().retire();
    server.stop();
    if (metrics) metrics->stop();
    io.stop();
  });
  watch_reload(hup);
  asio::steady_timer watchdog(io), sweeper(io);
  start_watchdog(io, watchdog);
  start_checkin_sweep(sweeper, handler);
  spdlog::info("tiermemd {} node {} serving on {}{} (page size {}, config {}, incarnation {:x})", TIERMEM_VERSION,
               config.node_id, config.socket_path, node.control.empty() ? "" : " and " + node.control + " for peers",
               format_size(config.page_size), config.source, node.incarnation);
  sd_notifyf(0, "READY=1\nSTATUS=node %u serving on %s", static_cast<unsigned>(config.node_id),
             config.socket_path.c_str());
  std::vector<std::thread> workers;
  for (unsigned i = 1; i < k_io_threads; ++i) workers.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : workers) t.join();
  if (node.peers) node.peers->stop();
  return 0;
}

// Removes the node's memory files (no durable metadata: nothing would
// recover them), retired first when `retire`, so that a client still
// mapping them writes nothing more.
void remove_memory(const DaemonConfig& c, bool retire) {
  if (retire) (void)VersionSegments::retire_stale(c.dram_path, std::chrono::milliseconds(0));
  std::error_code ec;
  for (const std::string& dir : {c.dram_path, c.pmem_path}) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("dram.", 0) == 0 || name.rfind("pmem.", 0) == 0 || name.rfind("versions.", 0) == 0 ||
          name.rfind("header.", 0) == 0) {
        std::filesystem::remove(e.path(), ec);
      }
    }
  }
}

int serve(const DaemonConfig& config) {
  int rc = 0;
  {
    Node node(config);
    if (rc = start(config, &node); rc != 0) return rc;
    // Before any client can connect; gone before the segments are.
    LivenessHolder liveness(node.space->versions());
    asio::io_context io;
    asio::thread_pool pool(k_pool_threads);
    RequestHandler handler(*node.space, config, *node.tenants, node.data_plane.get(), node.peers.get(), node.secret,
                           node.incarnation);
    ControlServer server(io, pool, handler, config,
                         node.members.empty() ? "" : (config.cluster_listen.empty() ? node.control : config.cluster_listen),
                         node.peers ? &node.peers->slots() : nullptr);
    rc = run(config, node, server, io, handler);
    pool.join();
  }
  spdlog::info("stopped");
  return rc;
}

// --check-config: the file, its cluster file and check_config_here, as the
// start makes them; then what only a start can check. Problems on stderr
// (exit 2), the rest on stdout.
int check_config(const DaemonConfig& config) {
  std::string control;
  auto members = load_members(config, &control);
  if (!members.ok()) {
    std::fprintf(stderr, "tiermemd: %s\n", members.status().message().c_str());
    return 2;
  }
  const size_t peers = peers_of(*members);
  const ConfigCheck checked = check_config_here(config, peers);
  for (const Status& problem : checked.problems) std::fprintf(stderr, "tiermemd: %s\n", problem.message().c_str());
  if (!checked.problems.empty()) return 2;
  std::printf("%s: configuration is valid%s\n", config.source.c_str(),
              members->empty() ? "" : (" (cluster of " + std::to_string(members->size()) + " nodes)").c_str());
  for (const std::string& note : checked.notes) std::printf("note: %s\n", note.c_str());
  std::printf("only a start can check:\n");
  for (const std::string& left : checks_left_to_start(config, peers)) std::printf("  %s\n", left.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory_for_reuse();
  CLI::App app{"tiermemd: tiered memory daemon (VRAM, DRAM, PMEM) of a tiermem node"};
  std::string config_path;
  bool check_only = false;
  app.add_option("-c,--config", config_path,
                 std::string("TOML configuration (default: ") + k_default_config +
                     " if present, else built-in defaults)");
  app.add_flag("--check-config", check_only,
               "check the configuration (and cluster file) on this machine as a start does, say what only a start "
               "can check, and exit");
  app.set_version_flag("--version",
                       std::string("tiermemd ") + TIERMEM_VERSION +
                           (TIERMEM_HAVE_CUDA ? " (VRAM tier: CUDA" : " (VRAM tier: not built, no CUDA") +
                           (TIERMEM_HAVE_LIBFABRIC ? std::string("; fabrics: ucx, libfabric ") + TIERMEM_LIBFABRIC_VERSION
                                                   : std::string("; fabrics: ucx (libfabric not built)")) +
                           ")");
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "trace, debug, info, warn, error, critical or off (over $TIERMEM_LOG_LEVEL, over log.level)");
  add_man_flag(app, {.name = "tiermemd",
                     .section = 8,
                     .summary = "the tiermem node daemon: one node's VRAM, DRAM and PMEM in a cluster's address space",
                     .source = std::string("tiermem ") + TIERMEM_VERSION,
                     .see_also = {"tiermemctl(8)", "tiermemd.toml(5)", "tiermem-exec(1)"},
                     .extra = ".SH FILES\n.TP\n/etc/tiermem/tiermemd.toml\nthe configuration, read when present "
                              "(tiermemd.toml(5))\n.SH ENVIRONMENT\n.TP\nTIERMEM_LOG_LEVEL\nthe log level, "
                              "over log.level\n.SH EXIT STATUS\n0 after a clean stop or a good --check-config; 1 on "
                              "an error (it says what and why); 2 on bad usage.\n"});
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the usage error, or --help / --version
    return code == 0 ? 0 : 2;
  }

  std::signal(SIGPIPE, SIG_IGN);
  DaemonConfig config;
  if (config_path.empty() && std::filesystem::exists(k_default_config)) config_path = k_default_config;
  if (!config_path.empty()) {
    auto loaded = load_config(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "tiermemd: %s\n", loaded.status().message().c_str());
      return 2;
    }
    config = std::move(loaded).value();
  } else {
    config.dram_path = "/dev/shm/tiermem-node" + std::to_string(config.node_id);
  }
  g_reload.config_path = config_path;
  if (const char* env = std::getenv("TIERMEM_LOG_LEVEL"); env != nullptr && *env != '\0') {
    g_reload.log_level = env;
  }
  if (!log_level.empty()) g_reload.log_level = log_level;
  if (!g_reload.log_level.empty()) config.log_level = g_reload.log_level;
  if (check_only) {
    if (Status s = set_log_level(config.log_level); !s.ok()) {
      std::fprintf(stderr, "tiermemd: %s\n", s.message().c_str());
      return 2;
    }
    return check_config(config);
  }
  if (Status s = setup_logging(config.log_level, "tiermemd"); !s.ok()) {
    std::fprintf(stderr, "tiermemd: %s\n", s.message().c_str());
    return 2;
  }
  return serve(config);
}
