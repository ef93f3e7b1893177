// The tenant planes of the data plane, probed as a tenant would (the
// security tests run it as other users, with setpriv). One line on stdout:
//   ok TEXT | error CODE MESSAGE       exit status 0 either way; 2: usage
//
//   plane_probe SOCKET keys NODE FILE
//       writes what this tenant's daemon tells it of NODE (its NodeInfo:
//       this tenant's plane address and keys) to FILE, readable by all
//   plane_probe SOCKET attack NODE FILE
//       with another tenant's view of NODE from FILE, tries what a hostile
//       tenant could: that tenant's keys through this tenant's own plane at
//       NODE (a get of 8 bytes at each region), and that tenant's listener
//       with a guessed token and with this tenant's own token. Prints
//       "ok refused=N reached=M distinct=D" (D: 1 when the two planes'
//       addresses differ), M counting what got through.
//   plane_probe SOCKET flood NODE FILE COUNT SECONDS ucx|tcp
//       what anyone on the host can do to a plane's listener, whose port
//       `ss -ltn` shows: COUNT connections to the listener of the plane in
//       FILE that never say hello, held SECONDS: UCX connections (through
//       UCX's connection manager) or bare TCP ones. Prints "ok flooding N"
//       (N made) once they are up, then holds them and exits 0.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status_macros.h>

#include "control.pb.h"
#include "rpc_connection.hpp"
#include "transport/transport.hpp"

namespace {

using namespace tiermem;

int report(const Status& s, const std::string& text = "") {
  if (s.ok()) {
    std::printf("ok %s\n", text.c_str());
  } else {
    std::printf("error %u %s\n", static_cast<unsigned>(s.code()), s.message().c_str());
  }
  return 0;
}

Result<proto::NodeInfo> view_of(const char* socket, NodeId node) {
  TIERMEM_ASSIGN_OR_RETURN(auto conn, RpcConnection::connect_unix(socket));
  proto::Request hello;
  hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION_CURRENT);
  TIERMEM_RETURN_IF_ERROR(conn->call(hello).status());
  proto::Request r;
  r.mutable_nodes()->set_node(node);
  r.mutable_nodes()->set_refresh(true);
  TIERMEM_ASSIGN_OR_RETURN(auto response, conn->call(r));
  for (const proto::NodeInfo& n : response.nodes().nodes()) {
    if (n.node_id() == node) return n;
  }
  return Status(ErrorCode::not_found, "node " + std::to_string(node) + " is not in the view");
}

// Where the admission token is in `address`: the last word of a UCX
// listener's ("tmucx-listener IP PORT TOKEN"), the third of a libfabric
// transport's ("tmofi1 PROVIDER TOKEN PID NAME").
std::pair<size_t, size_t> token_span(const std::string& address) {
  if (!is_ofi_address(address)) return {address.rfind(' ') + 1, std::string::npos};
  const size_t start = address.find(' ', address.find(' ') + 1) + 1;
  return {start, address.find(' ', start) - start};
}

// `address` with another token.
std::string with_token(const std::string& address, const std::string& token) {
  const auto [at, length] = token_span(address);
  std::string out = address;
  return out.replace(at, length == std::string::npos ? out.size() - at : length, token);
}

std::string token_of(const std::string& address) {
  const auto [at, length] = token_span(address);
  return address.substr(at, length);
}

// Another tenant's view of a node, as `keys` wrote it.
Result<proto::NodeInfo> read_view(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  proto::NodeInfo view;
  if (!in || !view.ParseFromString(bytes.str())) {
    return Status(ErrorCode::invalid_argument, "cannot read or parse " + file);
  }
  return view;
}

int attack(const char* socket, NodeId node, const std::string& file) {
  auto view = read_view(file);
  if (!view.ok()) return report(view.status());
  const proto::NodeInfo& theirs = *view;
  auto mine = view_of(socket, node);
  if (!mine.ok()) return report(mine.status());
  if (mine->transport_address().empty() || theirs.transport_address().empty()) {
    return report(Status(ErrorCode::not_found, std::string("no plane of ") +
                                                   (mine->transport_address().empty() ? "this tenant" : "the other") +
                                                   " at that node (" + std::to_string(mine->regions_size()) +
                                                   " regions of this tenant's there)"));
  }
  // On the fabric of the plane it probes, as a client's would be.
  auto transport = make_transport_for(mine->transport_address(), {});
  if (!transport.ok()) return report(transport.status());
  Transport& t = **transport;
  auto ep = t.connect(mine->transport_address());
  if (!ep.ok()) return report(ep.status().with_context("this tenant's own plane"));
  int refused = 0, reached = 0;
  // Their keys on our endpoint: their regions are not registered in our
  // plane, whatever the key says.
  for (const proto::RegionKey& k : theirs.regions()) {
    auto key = t.unpack(*ep, k.packed_key(), k.base());
    if (!key.ok()) {
      ++refused;
      continue;
    }
    auto b = t.batch();
    uint64_t word = 0;
    Status s = t.get(*b, **ep, &word, 8, k.base(), **key);
    if (s.ok()) s = t.wait(*b, std::chrono::seconds(10));
    s.ok() ? ++reached : ++refused;
    if (!s.ok() && s.code() != ErrorCode::out_of_range) std::fprintf(stderr, "their key: %s\n", s.to_string().c_str());
  }
  // Their listener, a guessed token; their listener, our token.
  std::mt19937_64 random{std::random_device{}()};
  char guessed[17];
  std::snprintf(guessed, sizeof guessed, "%016llx", static_cast<unsigned long long>(random() | 1));
  for (const std::string& address : {with_token(theirs.transport_address(), guessed),
                                     with_token(theirs.transport_address(), token_of(mine->transport_address()))}) {
    auto other = t.connect(address);
    if (other.ok()) {
      ++reached;
    } else {
      ++refused;
      if (other.status().code() != ErrorCode::permission_denied) {
        std::fprintf(stderr, "their listener: %s\n", other.status().to_string().c_str());
      }
    }
  }
  const bool distinct = mine->transport_address() != theirs.transport_address();
  return report(Status(), "refused=" + std::to_string(refused) + " reached=" + std::to_string(reached) +
                              " distinct=" + std::to_string(distinct ? 1 : 0));
}

// Connections that never say hello (see the header comment).
int flood(const std::string& file, int count, int seconds, const std::string& mode) {
  auto view = read_view(file);
  if (!view.ok()) return report(view.status());
  const proto::NodeInfo& theirs = *view;
  char ip[64] = {};
  unsigned port = 0;
  if (std::sscanf(theirs.transport_address().c_str(), "tmucx-listener %63s %u", ip, &port) != 2) {
    return report(Status(ErrorCode::invalid_argument, "not a UCX listener: " + theirs.transport_address()));
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &files);
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip, &to.sin_addr);
  int made = 0;
  std::vector<int> sockets;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_ep_h> eps;
  if (mode == "tcp") {
    for (int i = 0; i < count; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
        ::close(fd);
        continue;
      }
      sockets.push_back(fd);
      ++made;
    }
  } else {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK || ucp_init(&params, config, &context) != UCS_OK) {
      return report(Status(ErrorCode::transport_error, "UCX would not start"));
    }
    ucp_config_release(config);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context, &wp, &worker) != UCS_OK) {
      return report(Status(ErrorCode::transport_error, "no UCX worker"));
    }
    for (int i = 0; i < count; ++i) {
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
      p.sockaddr.addr = reinterpret_cast<const sockaddr*>(&to);
      p.sockaddr.addrlen = sizeof to;
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};  // turned away: expected
      ucp_ep_h ep = nullptr;
      if (ucp_ep_create(worker, &p, &ep) != UCS_OK) continue;
      eps.push_back(ep);
      ++made;
      for (int k = 0; k < 4; ++k) ucp_worker_progress(worker);
    }
  }
  std::printf("ok flooding %d\n", made);
  std::fflush(stdout);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (worker != nullptr) {
      ucp_worker_progress(worker);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Gone without a word: the process exits, its sockets with it.
  std::_Exit(0);
}

int keys(const char* socket, NodeId node, const std::string& file) {
  auto view = view_of(socket, node);
  if (!view.ok()) return report(view.status());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << view->SerializeAsString();
  out.close();
  if (!out) return report(Status(ErrorCode::io_error, "cannot write " + file));
  ::chmod(file.c_str(), 0644);
  return report(Status(), std::to_string(view->regions_size()) + " " +
                              (view->transport_address().empty() ? "none" : "plane"));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::string(argv[2]) == "flood") {
    return flood(argv[4], std::atoi(argv[5]), std::atoi(argv[6]), argv[7]);
  }
  if (argc != 5) {
    std::fprintf(stderr, "usage: plane_probe SOCKET keys|attack NODE FILE\n");
    return 2;
  }
  const std::string op = argv[2];
  const auto node = static_cast<NodeId>(std::strtoul(argv[3], nullptr, 10));
  if (op == "keys") return keys(argv[1], node, argv[4]);
  if (op == "attack") return attack(argv[1], node, argv[4]);
  std::fprintf(stderr, "usage: plane_probe SOCKET keys|attack NODE FILE\n");
  return 2;
}
