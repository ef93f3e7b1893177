#include "tests/support/in_process_daemon.hpp"

#include <utility>  // before Asio (Boost 1.74 with C++20)

#include <boost/asio.hpp>

#include <filesystem>
#include <thread>
#include <vector>

#include <tiermem/status_macros.h>

#include "daemon/config.hpp"
#include "daemon/control_server.hpp"
#include "daemon/request_handler.hpp"
#include "daemon/tenants.hpp"
#include "mapping/address_space.hpp"
#include "mapping/version_segments.hpp"
#include "tests/support/test_daemon.hpp"
#include "tiers/tier_backend.hpp"

namespace tiermem::test {

struct InProcessDaemon::State {
  DaemonConfig config;
  std::unique_ptr<AddressSpace> space;
  std::optional<TenantMap> tenants;
  std::unique_ptr<LivenessHolder> liveness;
  boost::asio::io_context io;
  std::unique_ptr<boost::asio::thread_pool> pool;
  std::unique_ptr<RequestHandler> handler;
  std::unique_ptr<ControlServer> server;
  std::vector<std::thread> threads;
};

InProcessDaemon::InProcessDaemon(uint64_t dram, uint64_t pmem) : m_state(std::make_unique<State>()) {
  const std::string parent = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  m_dir = make_temp_dir_in(parent, "tiermem-inproc");
  m_socket = m_dir + "/tiermemd.sock";
  DaemonConfig& c = m_state->config;
  c.socket_path = m_socket;
  c.dram_capacity = dram;
  c.dram_path = m_dir + "/dram";
  c.pmem_capacity = pmem;
  c.pmem_path = m_dir + "/pmem";
  c.metadata_enabled = false;
  std::filesystem::create_directories(c.dram_path);
  std::filesystem::create_directories(c.pmem_path);
  m_status = [&]() -> Status {
    TierSet tiers;
    TIERMEM_ASSIGN_OR_RETURN(tiers[static_cast<size_t>(Tier::dram)],
                             make_dram_tier({c.dram_path, c.dram_capacity, c.max_tenants_per_node}));
    TIERMEM_ASSIGN_OR_RETURN(tiers[static_cast<size_t>(Tier::pmem)],
                             make_pmem_tier({c.pmem_path, c.pmem_capacity, c.max_tenants_per_node}));
    AddressSpaceOptions o;
    o.node = c.node_id;
    o.page_size = c.page_size;
    o.domains = c.max_tenants_per_node;
    o.sub_page_max = c.sub_page_bytes();
    o.versions_dir = c.dram_path;
    o.incarnation = 7;
    TIERMEM_ASSIGN_OR_RETURN(m_state->space, AddressSpace::create(o, std::move(tiers)));
    TIERMEM_ASSIGN_OR_RETURN(auto tenants, TenantMap::create(c));
    m_state->tenants.emplace(std::move(tenants));
    m_state->liveness = std::make_unique<LivenessHolder>(m_state->space->versions());
    m_state->pool = std::make_unique<boost::asio::thread_pool>(4);
    m_state->handler = std::make_unique<RequestHandler>(*m_state->space, c, *m_state->tenants, nullptr, nullptr,
                                                        ClusterSecret{}, 7);
    m_state->server =
        std::make_unique<ControlServer>(m_state->io, *m_state->pool, *m_state->handler, c, "", nullptr);
    TIERMEM_RETURN_IF_ERROR(m_state->server->listen());
    m_state->server->start();
    for (int i = 0; i < 2; ++i) m_state->threads.emplace_back([this] { m_state->io.run(); });
    return Status();
  }();
}

InProcessDaemon::~InProcessDaemon() {
  if (m_state->server) m_state->server->stop();
  m_state->io.stop();
  for (std::thread& t : m_state->threads) t.join();
  if (m_state->pool) m_state->pool->join();
  m_state->server.reset();
  m_state->handler.reset();
  m_state->liveness.reset();
  m_state->space.reset();
  std::error_code ec;
  std::filesystem::remove_all(m_dir, ec);
}

std::unique_ptr<Client> InProcessDaemon::connect(const std::string& name) const {
  auto c = Client::connect({.socket_path = m_socket, .client_name = name});
  return c.ok() ? std::move(c).value() : nullptr;
}

}  // namespace tiermem::test
