// tiermemd: the per-node tiermem daemon.
#include <utility>  // before Asio (Boost 1.74 with C++20)

#include <signal.h>
#include <systemd/sd-daemon.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <spdlog/spdlog.h>

#include "common/log.hpp"
#include "common/units.hpp"
#include "daemon/config.hpp"
#include "daemon/control_server.hpp"
#include "daemon/request_handler.hpp"
#include "mapping/address_space.hpp"
#include "tiermem_config.h"

namespace {

using namespace tiermem;
namespace asio = boost::asio;

constexpr const char* k_default_config = "/etc/tiermem/tiermemd.toml";
constexpr unsigned k_io_threads = 2;

Result<TierSet> open_tiers(const DaemonConfig& c) {
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
    auto dram = make_dram_tier(c.dram_capacity, "tiermem-dram-node" + std::to_string(c.node_id));
    if (!dram.ok()) return dram.status();
    tiers[static_cast<size_t>(Tier::dram)] = std::move(dram).value();
  }
  if (c.pmem_enabled) {
    auto pmem = make_pmem_tier({c.pmem_path, c.pmem_capacity});
    if (!pmem.ok()) return pmem.status();
    tiers[static_cast<size_t>(Tier::pmem)] = std::move(pmem).value();
  }
  return tiers;
}

void log_tiers(const AddressSpace& space) {
  for (const TierStat& t : space.tier_stats()) {
    spdlog::info("tier {}: {} on {}{}", tier_name(t.tier), format_size(t.capacity_bytes), t.backing,
                 t.persistent ? " (persistent)" : "");
  }
}

// Pets the systemd watchdog at half its interval, when the unit asks for one.
void start_watchdog(asio::io_context& io, asio::steady_timer& timer) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  const auto period = std::chrono::microseconds(usec / 2);
  std::function<void()> pet = [&timer, period, &pet]() {
    sd_notify(0, "WATCHDOG=1");
    timer.expires_after(period);
    timer.async_wait([&pet](const boost::system::error_code& ec) {
      if (!ec) pet();
    });
  };
  static std::function<void()> keep;
  keep = std::move(pet);
  asio::post(io, keep);
}

int serve(const DaemonConfig& config) {
  auto tiers = open_tiers(config);
  if (!tiers.ok()) {
    spdlog::critical("cannot start: {}", tiers.status().to_string());
    return 1;
  }
  AddressSpaceOptions options;
  options.node = config.node_id;
  options.page_size = config.page_size;
  options.virtual_pages = config.virtual_pages;
  auto space = AddressSpace::create(options, std::move(tiers).value());
  if (!space.ok()) {
    spdlog::critical("cannot start: {}", space.status().to_string());
    return 1;
  }
  log_tiers(**space);

  asio::io_context io;
  RequestHandler handler(**space, config);
  ControlServer server(io, handler, config);
  if (Status s = server.listen(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.to_string());
    return 1;
  }
  server.start();

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

  spdlog::info("tiermemd {} node {} serving on {} (page size {}, config {})", TIERMEM_VERSION,
               config.node_id, config.socket_path, format_size(config.page_size), config.source);
  sd_notifyf(0, "READY=1\nSTATUS=node %u serving on %s", static_cast<unsigned>(config.node_id),
             config.socket_path.c_str());

  std::vector<std::thread> workers;
  for (unsigned i = 1; i < k_io_threads; ++i) workers.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : workers) t.join();
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
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  app.set_version_flag("--version", std::string("tiermemd ") + TIERMEM_VERSION);
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
    std::printf("%s: configuration is valid\n", config.source.c_str());
    return 0;
  }
  if (Status s = setup_logging(config.log_level, "tiermemd"); !s.ok()) {
    std::fprintf(stderr, "tiermemd: %s\n", s.message().c_str());
    return 2;
  }
  return serve(config);
}
