#include "tests/support/netns.hpp"

#include <unistd.h>

#include <cstdlib>

namespace tiermem::test {
namespace {

constexpr const char* k_ip = "/usr/sbin/ip";

bool sh(const std::vector<std::string>& argv) { return run_command(argv).exit_code == 0; }

int tag() { return ::getpid() % 200 + 20; }

}  // namespace

std::string netns_unavailable() {
  if (::geteuid() != 0) return "network namespaces need root";
  const std::string probe = "tmprobe" + std::to_string(::getpid());
  if (!sh({k_ip, "netns", "add", probe}) || !sh({k_ip, "netns", "del", probe})) {
    return "`ip netns add` does not work here (no CAP_SYS_ADMIN, or no iproute2)";
  }
  return "";
}

Network::Network(int nodes) : m_nodes(nodes) {
  m_subnet = "10.213." + std::to_string(tag()) + ".";
  m_bridge = "tmbr" + std::to_string(tag());
  m_ok = sh({k_ip, "link", "add", m_bridge, "type", "bridge"}) &&
         sh({k_ip, "addr", "add", m_subnet + "254/24", "dev", m_bridge}) && sh({k_ip, "link", "set", m_bridge, "up"});
  for (int i = 1; i <= nodes && m_ok; ++i) {
    const std::string n = ns(i), h = host(i);
    m_ok = sh({k_ip, "netns", "add", n}) &&
           sh({k_ip, "link", "add", h, "type", "veth", "peer", "name", "tmeth0", "netns", n}) &&
           sh({k_ip, "-n", n, "addr", "add", address(i) + "/24", "dev", "tmeth0"}) &&
           sh({k_ip, "-n", n, "link", "set", "tmeth0", "up"}) && sh({k_ip, "-n", n, "link", "set", "lo", "up"}) &&
           sh({k_ip, "link", "set", h, "master", m_bridge}) && sh({k_ip, "link", "set", h, "up"});
  }
}

Network::~Network() {
  for (int i = 1; i <= m_nodes; ++i) {
    sh({k_ip, "link", "del", host(i)});  // takes its peer in the namespace along
    sh({k_ip, "netns", "del", ns(i)});
  }
  sh({k_ip, "link", "del", m_bridge});
}

std::string Network::ns(int i) const { return "tmns" + std::to_string(::getpid()) + "n" + std::to_string(i); }

std::string Network::host(int i) const { return "tmh" + std::to_string(tag()) + "n" + std::to_string(i); }

bool Network::link(int i, bool up) { return sh({k_ip, "-n", ns(i), "link", "set", "tmeth0", up ? "up" : "down"}); }

std::vector<std::string> Network::exec_in(int i) const {
  return {k_ip, "netns", "exec", ns(i), "env", "UCX_TLS=tcp", "UCX_NET_DEVICES=tmeth0"};
}

void Network::place(int i, DaemonOptions& o) const {
  o.tls = "tcp";
  o.extra_toml = "devices = \"tmeth0\"\n" + o.extra_toml;  // [transport] is the last table written
  o.wrapper = {k_ip, "netns", "exec", ns(i)};
}

void Network::use_bridge() const {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("UCX_NET_DEVICES", m_bridge.c_str(), 1);
}

std::unique_ptr<TestCluster> cluster_in(const Network& net, int nodes, const DaemonOptions& base) {
  return std::make_unique<TestCluster>(
      nodes, base, [&](int id) { return net.address(id) + ":7100"; }, [&](int id, DaemonOptions& o) { net.place(id, o); });
}

}  // namespace tiermem::test
