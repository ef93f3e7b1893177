// tiermemd: the per-node tiermem daemon.
#include <utility>  // before Asio (Boost 1.74 with C++20)

#include <signal.h>
#include <systemd/sd-daemon.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include <tiermem/status_macros.h>
#include <tiermem/units.h>

#include "common/log.hpp"
#include "common/shared_memory.hpp"
#include "common/unique_fd.hpp"
#include "convert.hpp"
#include "daemon/cluster_file.hpp"
#include "daemon/config.hpp"
#include "daemon/control_server.hpp"
#include "daemon/peer_manager.hpp"
#include "daemon/request_handler.hpp"
#include "mapping/address_space.hpp"
#include "tiermem_config.h"
#include "transport/transport.hpp"

namespace {

using namespace tiermem;
namespace asio = boost::asio;

constexpr const char* k_default_config = "/etc/tiermem/tiermemd.toml";
constexpr unsigned k_io_threads = 2;
constexpr unsigned k_pool_threads = 4;

Result<TierSet> open_tiers(const DaemonConfig& c, const SharedMemoryFactory& shared) {
  TierSet tiers;
  if (c.vram_enabled) {
    auto vram = make_vram_tier(c.vram_device, c.vram_capacity);
    if (vram.ok()) {
      tiers[static_cast<size_t>(Tier::vram)] = std::move(vram).value();
    } else if (c.vram_required || vram.status().code() != ErrorCode::tier_unavailable) {
      return vram.status().with_context("VRAM tier");
    } else {
      spdlog::info("VRAM tier off: {}", vram.status().message());
    }
  }
  if (c.dram_enabled) {
    TIERMEM_ASSIGN_OR_RETURN(auto dram,
                             make_dram_tier(c.dram_capacity, "tiermem-dram-node" + std::to_string(c.node_id), shared));
    tiers[static_cast<size_t>(Tier::dram)] = std::move(dram);
  }
  if (c.pmem_enabled) {
    TIERMEM_ASSIGN_OR_RETURN(auto pmem, make_pmem_tier({c.pmem_path, c.pmem_capacity}));
    tiers[static_cast<size_t>(Tier::pmem)] = std::move(pmem);
  }
  return tiers;
}

void log_tiers(const AddressSpace& space) {
  for (const TierStat& t : space.tier_stats()) {
    spdlog::info("tier {}: {} on {}{}", tier_name(t.tier), format_size(t.capacity_bytes), t.backing,
                 t.persistent ? " (persistent)" : "");
  }
}

// The data plane: the transport, the memory it provides or registers, and
// how this node describes itself to peers and clients (incarnation, address,
// region keys).
class DataPlane {
 public:
  static Result<std::unique_ptr<DataPlane>> start(const DaemonConfig& config) {
    auto transport = make_ucx_transport(
        {.tls = config.transport_tls, .devices = config.transport_devices, .progress_thread = true});
    if (!transport.ok()) return transport.status().with_context("starting the data plane (UCX)");
    auto dp = std::unique_ptr<DataPlane>(new DataPlane);
    dp->m_transport = std::move(transport).value();
    return dp;
  }

  Transport* transport() const { return m_transport.get(); }

  // Memory for the DRAM tier and the version array: from the transport when
  // it can (peers on shared memory then map it), else a memfd.
  SharedMemoryFactory shared_memory() {
    return [this](const std::string& name, size_t size) -> Result<SharedMemory> {
      auto a = m_transport->allocate_shared(size);
      if (!a.ok()) {
        if (a.status().code() != ErrorCode::not_supported) {
          spdlog::info("{}: transport memory unavailable ({}); using a memfd", name, a.status().message());
        }
        return SharedMemory::create(name, size);
      }
      std::shared_ptr<RegisteredRegion> region(std::move(a->region));
      m_registered.push_back(region);
      spdlog::info("{}: {} of transport-allocated shared memory", name, format_size(a->length));
      return SharedMemory::adopt(a->base, size, UniqueFd(a->fd), region);
    };
  }

  // Registers what is not registered yet and builds this node's NodeInfo.
  Result<proto::NodeInfo> describe(const DaemonConfig& config, AddressSpace& space, const std::string& control) {
    proto::NodeInfo self;
    self.set_node_id(config.node_id);
    self.set_control_address(control);
    self.set_page_size(space.page_size());
    std::random_device rd;
    self.set_incarnation((static_cast<uint64_t>(rd()) << 32) | rd());
    self.set_transport_address(m_transport->address());
    auto add = [&](void* base, size_t length, MemoryKind kind, bool versions, Tier tier, bool persistent) -> Status {
      std::shared_ptr<RegisteredRegion> region;
      for (const auto& r : m_registered) {
        if (r->base() == reinterpret_cast<uint64_t>(base)) region = r;
      }
      if (!region) {
        TIERMEM_ASSIGN_OR_RETURN(auto reg, m_transport->register_region(base, length, kind));
        region = std::shared_ptr<RegisteredRegion>(std::move(reg));
        m_registered.push_back(region);
      }
      proto::RegionKey* k = self.add_regions();
      k->set_kind(versions ? proto::Region::VERSIONS : proto::Region::TIER);
      k->set_tier(wire::to_proto(tier));
      k->set_base(region->base());
      k->set_length(length);
      k->set_packed_key(region->packed_key());
      k->set_persistent(persistent);
      return Status();
    };
    if (Status s = add(space.versions().base(), space.versions().bytes(), MemoryKind::host, true, Tier::automatic,
                       false);
        !s.ok()) {
      return s.with_context("registering the version array");
    }
    for (Tier t : k_tiers_fastest_first) {
      TierBackend* b = space.backend(t);
      if (b == nullptr) continue;
      const MemoryKind kind = b->host_base() != nullptr ? MemoryKind::host : MemoryKind::cuda;
      Status s = add(b->region_base(), b->capacity(), kind, false, t, b->persistent());
      if (!s.ok()) {
        // Peers then reach this tier only through this daemon (e.g. VRAM with
        // a UCX built without CUDA).
        spdlog::info("{} tier not reachable one-sided: {}", tier_name(t), s.message());
      }
    }
    return self;
  }

 private:
  DataPlane() = default;
  std::unique_ptr<Transport> m_transport;
  // Registrations end before the transport.
  std::vector<std::shared_ptr<RegisteredRegion>> m_registered;
};

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

int serve(const DaemonConfig& config) {
  std::string control;
  auto members = load_members(config, &control);
  if (!members.ok()) {
    spdlog::critical("cannot start: {}", members.status().to_string());
    return 2;
  }
  auto dp = DataPlane::start(config);
  if (!dp.ok()) {
    spdlog::critical("cannot start: {}", dp.status().to_string());
    return 1;
  }
  auto tiers = open_tiers(config, (*dp)->shared_memory());
  if (!tiers.ok()) {
    spdlog::critical("cannot start: {}", tiers.status().to_string());
    return 1;
  }
  AddressSpaceOptions options;
  options.node = config.node_id;
  options.page_size = config.page_size;
  options.virtual_pages = config.virtual_pages;
  options.shared_memory = (*dp)->shared_memory();
  auto space = AddressSpace::create(options, std::move(tiers).value());
  if (!space.ok()) {
    spdlog::critical("cannot start: {}", space.status().to_string());
    return 1;
  }
  log_tiers(**space);
  auto self = (*dp)->describe(config, **space, control);
  if (!self.ok()) {
    spdlog::critical("cannot start: {}", self.status().to_string());
    return 1;
  }

  std::unique_ptr<PeerManager> peers;
  if (!members->empty()) {
    PeerOptions po;
    po.self = config.node_id;
    po.members = *members;
    po.reconnect_interval = std::chrono::milliseconds(config.reconnect_interval_ms);
    po.heartbeat_interval = std::chrono::milliseconds(config.heartbeat_interval_ms);
    po.timeout = std::chrono::milliseconds(config.peer_timeout_ms);
    peers = std::make_unique<PeerManager>(po, *self, (*dp)->transport());
  }

  asio::io_context io;
  asio::thread_pool pool(k_pool_threads);
  RequestHandler handler(**space, config, *self, peers.get(), peers ? (*dp)->transport() : nullptr);
  ControlServer server(io, pool, handler, config,
                       members->empty() ? "" : (config.cluster_listen.empty() ? control : config.cluster_listen));
  if (Status s = server.listen(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.to_string());
    return 1;
  }
  server.start();
  if (peers) peers->start();

  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signo) {
    if (ec) return;
    spdlog::info("received {}, shutting down", signo == SIGTERM ? "SIGTERM" : "SIGINT");
    sd_notify(0, "STOPPING=1");
    server.stop();
    io.stop();
  });
  asio::steady_timer watchdog(io);
  start_watchdog(io, watchdog);

  spdlog::info("tiermemd {} node {} serving on {}{} (page size {}, config {})", TIERMEM_VERSION, config.node_id,
               config.socket_path, control.empty() ? "" : " and " + control + " for peers",
               format_size(config.page_size), config.source);
  sd_notifyf(0, "READY=1\nSTATUS=node %u serving on %s", static_cast<unsigned>(config.node_id),
             config.socket_path.c_str());

  std::vector<std::thread> workers;
  for (unsigned i = 1; i < k_io_threads; ++i) workers.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : workers) t.join();
  if (peers) peers->stop();
  pool.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tiermemd: tiered memory daemon (VRAM, DRAM, PMEM) of a tiermem node"};
  std::string config_path;
  bool check_only = false;
  app.add_option("-c,--config", config_path,
                 std::string("TOML configuration (default: ") + k_default_config +
                     " if present, else built-in defaults)");
  app.add_flag("--check-config", check_only, "validate the configuration (and cluster file) and exit");
  app.set_version_flag("--version", std::string("tiermemd ") + TIERMEM_VERSION +
                                        (TIERMEM_HAVE_CUDA ? " (VRAM tier: CUDA)" : " (VRAM tier: not built, no CUDA)"));
  CLI11_PARSE(app, argc, argv);

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
  }
  if (check_only) {
    std::string control;
    auto members = load_members(config, &control);
    if (!members.ok()) {
      std::fprintf(stderr, "tiermemd: %s\n", members.status().message().c_str());
      return 2;
    }
    std::printf("%s: configuration is valid%s\n", config.source.c_str(),
                members->empty() ? "" : (" (cluster of " + std::to_string(members->size()) + " nodes)").c_str());
    return 0;
  }
  if (Status s = setup_logging(config.log_level, "tiermemd"); !s.ok()) {
    std::fprintf(stderr, "tiermemd: %s\n", s.message().c_str());
    return 2;
  }
  return serve(config);
}
