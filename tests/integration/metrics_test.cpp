// The Prometheus endpoint (O4) of real daemons: what it counts after real
// requests, that `promtool check metrics` accepts the exposition, that bad
// HTTP gets an error while the daemon serves on, and that a real Prometheus
// (Debian's package) scrapes two daemons and answers a query with their
// values.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/test_daemon.hpp"

namespace tiermem {
namespace {

using namespace std::chrono_literals;

int connect_tcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

struct HttpReply {
  int status = 0;
  std::string head;
  std::string body;
};

// Sends `request` as it is and reads the answer until the server closes.
HttpReply http_exchange(int port, const std::string& request) {
  HttpReply r;
  const int fd = connect_tcp(port);
  if (fd < 0) return r;
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string all;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t end = all.find("\r\n\r\n");
  r.head = all.substr(0, end);
  if (end != std::string::npos) r.body = all.substr(end + 4);
  if (all.rfind("HTTP/1.1 ", 0) == 0) r.status = std::stoi(all.substr(9, 3));
  return r;
}

HttpReply get(int port, const std::string& target, const std::string& method = "GET") {
  return http_exchange(port, method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

bool contains(const std::string& text, const std::string& re) { return std::regex_search(text, std::regex(re)); }

TEST(MetricsTest, TheEndpointCountsRequestsAndPromtoolAcceptsTheExposition) {
  test::TestDaemon daemon({.metrics = true});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  ASSERT_NE(daemon.log().find("metrics on http://127.0.0.1:" + std::to_string(daemon.metrics_port()) + "/metrics"),
            std::string::npos)
      << daemon.log();
  auto c = daemon.connect("metrics-test");
  ASSERT_NE(c, nullptr);
  auto a = c->alloc(1 << 20, {.tier = Tier::dram, .name = "counted"});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(c->free(a->gva).ok());
  EXPECT_EQ(c->free(a->gva).code(), ErrorCode::not_allocated);
  // Through the daemon: the bytes it carried are counted.
  auto slow = Client::connect({.socket_path = daemon.socket(), .direct_access = false});
  ASSERT_TRUE(slow.ok());
  auto b = (*slow)->alloc(64 << 10, {.tier = Tier::pmem});
  ASSERT_TRUE(b.ok());
  std::vector<char> data(4096, 'x');
  ASSERT_TRUE((*slow)->write(b->gva, data.data(), data.size()).ok());
  ASSERT_TRUE((*slow)->read(b->gva, data.data(), 1000).ok());

  const HttpReply r = get(daemon.metrics_port(), "/metrics");
  ASSERT_EQ(r.status, 200) << r.head;
  EXPECT_TRUE(contains(r.head, "Content-Type: text/plain; version=0.0.4")) << r.head;
  const std::string& m = r.body;
  EXPECT_TRUE(contains(m, R"(\ntiermem_tier_capacity_bytes\{node="1",tier="dram"\} 67108864\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_tier_capacity_bytes\{node="1",tier="pmem"\} 67108864\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_requests_total\{node="1",type="alloc",result="ok",tenant="[^"]+"\} 2\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_requests_total\{node="1",type="free",result="not_allocated",tenant="[^"]+"\} 1\n)"))
      << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_daemon_bytes_total\{node="1",path="write",tenant="[^"]+"\} 4096\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_daemon_bytes_total\{node="1",path="read",tenant="[^"]+"\} 1000\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_request_duration_seconds_count\{node="1",type="alloc"\} 2\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_request_duration_seconds_bucket\{node="1",type="alloc",le="\+Inf"\} 2\n)"))
      << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_tenant_allocations\{node="1",tenant="[^"]+",tier="pmem"\} 1\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_clients\{node="1",tenant="[^"]+",state="healthy"\} [1-9])")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_metadata_durable\{node="1"\} 1\n)")) << m;
  EXPECT_TRUE(contains(m, R"(\ntiermem_build_info\{node="1",version="[^"]+",fabric="ucx",libfabric="[0-9.]*"\} 1\n)"))
      << m;

  const std::string file = daemon.dir() + "/metrics.txt";
  std::ofstream(file) << m;
  auto check = test::run_command({"/bin/sh", "-c", "promtool check metrics < '" + file + "'"});
  EXPECT_EQ(check.exit_code, 0) << "promtool check metrics:\n" << check.out << check.err;
}

TEST(MetricsTest, BadHttpGetsAnErrorAndTheDaemonServesOn) {
  test::TestDaemon daemon({.metrics = true});
  ASSERT_TRUE(daemon.ready()) << daemon.log();
  const int port = daemon.metrics_port();
  EXPECT_EQ(get(port, "/nope").status, 404);
  const HttpReply post = get(port, "/metrics", "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_TRUE(contains(post.head, "Allow: GET, HEAD")) << post.head;
  const HttpReply head = get(port, "/metrics", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty()) << head.body.size();
  EXPECT_TRUE(contains(head.head, "Content-Length: [1-9]")) << head.head;
  EXPECT_EQ(http_exchange(port, "HELLO THERE\r\n\r\n").status, 400);
  EXPECT_EQ(http_exchange(port, "GET /metrics HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n").status, 431);
  EXPECT_EQ(http_exchange(port, "GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").status, 400);
  // A flood of idle connections: the endpoint turns the excess away, the
  // control socket serves on, and once they go a scrape works again.
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(connect_tcp(port));
  auto c = daemon.connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->alloc(4096).ok());
  for (int fd : idle) ::close(fd);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(get(port, "/metrics").status, 200);
  EXPECT_TRUE(daemon.alive()) << daemon.log();
}

TEST(MetricsTest, ABadListenAddressIsAConfigurationError) {
  test::TestDaemon daemon({.extra_toml = "[metrics]\nlisten = \"localhost\"\n"});
  EXPECT_FALSE(daemon.ready());
  EXPECT_NE(daemon.log().find("metrics.listen 'localhost' is not host:port"), std::string::npos) << daemon.log();
}

// A real Prometheus scraping the two daemons of a cluster every second,
// asked back through its HTTP API (promtool query instant).
TEST(MetricsTest, APrometheusScrapesTwoDaemonsAndAnswersAQuery) {
  ASSERT_EQ(test::run_command({"/bin/sh", "-c", "command -v prometheus promtool"}).exit_code, 0)
      << "prometheus and promtool are needed (Debian's prometheus package: tools/setup.sh deps)";
  test::TestCluster cluster(2, {.metrics = true});
  ASSERT_TRUE(cluster.ready() && cluster.wait_connected()) << cluster.logs();
  const std::string dir = cluster.dir() + "/prometheus";
  std::filesystem::create_directories(dir);
  const int web = test::free_port();
  {
    std::ofstream out(dir + "/prometheus.yml");
    out << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: tiermem\n"
        << "    static_configs:\n      - targets: ['127.0.0.1:" << cluster.node(1).metrics_port() << "', '127.0.0.1:"
        << cluster.node(2).metrics_port() << "']\n";
  }
  const std::string log = dir + "/prometheus.log";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execlp("prometheus", "prometheus", ("--config.file=" + dir + "/prometheus.yml").c_str(),
             ("--storage.tsdb.path=" + dir + "/data").c_str(),
             ("--web.listen-address=127.0.0.1:" + std::to_string(web)).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(pid, 0);
  auto query = [&](const std::string& expr) {
    return test::run_command({"promtool", "query", "instant", "http://127.0.0.1:" + std::to_string(web), expr}).out;
  };
  // Both nodes' DRAM capacities (64 MiB each), summed by Prometheus.
  std::string sum, health;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    sum = query("sum(tiermem_tier_capacity_bytes{job=\"tiermem\",tier=\"dram\"})");
    health = query("tiermem_peer_health{node=\"1\",peer=\"2\",state=\"healthy\"}");
    if (sum.find("=> 134217728 @") != std::string::npos && health.find("=> 1 @") != std::string::npos) break;
    std::this_thread::sleep_for(500ms);
  }
  // An operator on node 1 gets node 2's counters through its daemon.
  auto operator_client = cluster.node(1).connect("operator");
  ASSERT_NE(operator_client, nullptr);
  auto node2 = operator_client->metrics(2);
  ASSERT_TRUE(node2.ok()) << node2.status().to_string();
  EXPECT_NE(node2->find("tiermem_tier_capacity_bytes{node=\"2\",tier=\"dram\"}"), std::string::npos) << *node2;
  // The Grafana dashboard in config/ asks for families the daemons export,
  // in PromQL this Prometheus accepts.
  std::ifstream dashboard_file(std::string(TIERMEM_SOURCE_ROOT) + "/config/grafana/tiermem-dashboard.json");
  const auto dashboard = nlohmann::json::parse(dashboard_file);
  const std::string exposition = get(cluster.node(1).metrics_port(), "/metrics").body;
  size_t exprs = 0;
  for (const auto& panel : dashboard.at("panels")) {
    for (const auto& target : panel.at("targets")) {
      std::string expr = std::regex_replace(target.at("expr").get<std::string>(), std::regex("\\$node"), ".*");
      ++exprs;
      const std::regex name("tiermem_[a-z_]+");
      for (std::sregex_iterator it(expr.begin(), expr.end(), name), end; it != end; ++it) {
        const std::string family = std::regex_replace(it->str(), std::regex("_(bucket|sum|count)$"), "");
        EXPECT_NE(exposition.find("# TYPE " + family + " "), std::string::npos)
            << "panel '" << panel.at("title") << "' asks for " << it->str() << ", which no daemon exports";
      }
      auto q = test::run_command({"promtool", "query", "instant", "http://127.0.0.1:" + std::to_string(web), expr});
      EXPECT_EQ(q.exit_code, 0) << "panel '" << panel.at("title") << "': " << expr << "\n" << q.out << q.err;
    }
  }
  EXPECT_GE(exprs, 10u);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::ifstream in(log);
  const std::string prometheus_log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(sum.find("=> 134217728 @"), std::string::npos) << sum << "\n" << prometheus_log;
  EXPECT_NE(health.find("=> 1 @"), std::string::npos) << health << "\n" << prometheus_log;
}

}  // namespace
}  // namespace tiermem
