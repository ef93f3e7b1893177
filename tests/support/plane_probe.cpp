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
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>

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

int attack(const char* socket, NodeId node, const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  proto::NodeInfo theirs;
  if (!in || !theirs.ParseFromString(bytes.str())) {
    return report(Status(ErrorCode::invalid_argument, "cannot read or parse " + file));
  }
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
