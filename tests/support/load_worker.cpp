// A client process that keeps its daemon forwarding to peers for a while:
// every operation goes through the daemon (direct_access = false), and the
// targets are homed on other nodes. The backpressure tests start many of
// these (processes, so that the daemons see many sessions as in production).
//
//   load_worker [--direct] [--marks FD] SOCKET SECONDS TARGET...
//     add:GVA           fetch_add 1 on the (coherent) word at GVA
//     translate:GVA     translate GVA
//     lookup:NAME@NODE  look NAME up on NODE
//     write:GVA:LENGTH  write LENGTH bytes at GVA | read:GVA:LENGTH
//   --direct    reach memory directly (mapped, or the data plane) as a
//               trainer does, not through the daemon
//   --marks FD  writes "c" to FD once connected and "w" once its first
//               operation is done (the kill tests tell where a kill landed)
//
// Round-robin over the targets until SECONDS have passed, then one line on
// stdout:
//   done ops N refused N failed N adds GVA=N ... first_error TEXT
// refused: unavailable (a peer had too many requests outstanding), failed:
// any other error. Exit status 0; 2 for a usage error or no connection.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <tiermem/client.h>

namespace {

using tiermem::ErrorCode;
using tiermem::Gva;
using tiermem::Status;

struct Target {
  enum Kind { add, translate, lookup, write, read } kind;
  Gva gva;
  uint64_t length = 0;
  std::string name;
  tiermem::NodeId node = 0;
  std::string text;  // as given, for the report
};

bool parse_target(const std::string& arg, Target* out) {
  const size_t colon = arg.find(':');
  if (colon == std::string::npos) return false;
  const std::string kind = arg.substr(0, colon), rest = arg.substr(colon + 1);
  out->text = rest;
  if (kind == "lookup") {
    const size_t at = rest.find('@');
    if (at == std::string::npos) return false;
    out->kind = Target::lookup;
    out->name = rest.substr(0, at);
    out->node = static_cast<tiermem::NodeId>(std::strtoul(rest.c_str() + at + 1, nullptr, 10));
    return true;
  }
  std::string where = rest;
  if (kind == "write" || kind == "read") {
    const size_t c = rest.rfind(':');
    if (c == std::string::npos) return false;
    where = rest.substr(0, c);
    out->length = std::strtoull(rest.c_str() + c + 1, nullptr, 10);
    if (out->length == 0 || out->length > (64 << 20)) return false;
  }
  auto gva = Gva::parse(where);
  if (!gva.ok()) return false;
  out->gva = *gva;
  if (kind == "add") out->kind = Target::add;
  else if (kind == "translate") out->kind = Target::translate;
  else if (kind == "write") out->kind = Target::write;
  else if (kind == "read") out->kind = Target::read;
  else return false;
  return true;
}

Status run_one(tiermem::Client& c, const Target& t, std::vector<unsigned char>& buffer) {
  if (buffer.size() < t.length) buffer.resize(t.length, 0x5a);
  switch (t.kind) {
    case Target::write: return c.write(t.gva, buffer.data(), t.length);
    case Target::read: return c.read(t.gva, buffer.data(), t.length);
    case Target::add: return c.fetch_add(t.gva, 1).status();
    case Target::translate: return c.translate(t.gva).status();
    case Target::lookup: return c.lookup(t.name, t.node).status();
  }
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  bool direct = false;
  int marks = -1;
  while (argc > 1 && std::string(argv[1]).rfind("--", 0) == 0) {
    if (std::string(argv[1]) == "--direct") {
      direct = true;
      argv += 1;
      argc -= 1;
    } else if (std::string(argv[1]) == "--marks" && argc > 2) {
      marks = std::atoi(argv[2]);
      argv += 2;
      argc -= 2;
    } else {
      break;
    }
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: load_worker [--direct] [--marks FD] SOCKET SECONDS TARGET...\n");
    return 2;
  }
  std::vector<Target> targets;
  for (int i = 3; i < argc; ++i) {
    Target t;
    if (!parse_target(argv[i], &t)) {
      std::fprintf(stderr, "load_worker: bad target %s\n", argv[i]);
      return 2;
    }
    targets.push_back(std::move(t));
  }
  auto client = tiermem::Client::connect({.socket_path = argv[1], .client_name = "load", .direct_access = direct});
  if (!client.ok()) {
    std::printf("error %s\n", client.status().to_string().c_str());
    return 2;
  }
  if (marks >= 0) (void)!::write(marks, "c", 1);
  std::vector<unsigned char> buffer;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(
                                                             static_cast<int64_t>(std::atof(argv[2]) * 1000));
  uint64_t ops = 0, refused = 0, failed = 0;
  std::map<std::string, uint64_t> adds;
  std::string first_error;
  for (size_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
    const Target& t = targets[i % targets.size()];
    const Status s = run_one(**client, t, buffer);
    if (ops == 0 && marks >= 0) (void)!::write(marks, "w", 1);
    ++ops;
    if (s.ok()) {
      if (t.kind == Target::add) ++adds[t.text];
      continue;
    }
    ++(s.code() == ErrorCode::unavailable ? refused : failed);
    if (first_error.empty()) first_error = s.to_string();
  }
  std::printf("done ops %llu refused %llu failed %llu adds", static_cast<unsigned long long>(ops),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(failed));
  for (const auto& [gva, n] : adds) std::printf(" %s=%llu", gva.c_str(), static_cast<unsigned long long>(n));
  std::printf(" first_error %s\n", first_error.c_str());
  return 0;
}
