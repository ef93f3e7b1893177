// A trainer author's first tiermem program: allocate in every tier the local
// daemon offers, write, read back, and map an allocation for zero-copy use.
//
// Build against an installed tiermem:
//   g++ tiermem_example.cpp $(pkg-config --cflags --libs tiermem)    (Cflags carry -std=c++20)
// Run next to a daemon:  TIERMEM_SOCKET=/run/tiermem/tiermemd.sock ./tiermem_example
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include <tiermem/client.h>

namespace {

// Prints the error and returns true when `s` failed.
bool failed(const tiermem::Status& s, const char* what) {
  if (s.ok()) return false;
  std::fprintf(stderr, "%s failed: %s\n", what, s.to_string().c_str());
  return true;
}

// Allocates 4 MiB on `tier`, writes a pattern, reads it back and compares.
bool round_trip(tiermem::Client& client, tiermem::Tier tier) {
  const size_t size = 4 << 20;
  auto info = client.alloc(size, {.tier = tier, .strict = true,
                                  .name = std::string("example-") + std::string(tiermem::tier_name(tier))});
  if (failed(info.status(), "alloc")) return false;
  std::vector<unsigned char> out(size), in(size);
  std::iota(out.begin(), out.end(), static_cast<unsigned char>(tier));
  if (failed(client.write(info->gva, out.data(), out.size()), "write")) return false;
  if (failed(client.read(info->gva, in.data(), in.size()), "read")) return false;
  const bool same = out == in;
  std::printf("%-5s %s  wrote and read back %zu bytes: %s\n", std::string(tiermem::tier_name(tier)).c_str(),
              info->gva.to_string().c_str(), size, same ? "identical" : "MISMATCH");
  return same;
}

// Memory homed on another node: write and read it one-sided, count with a
// fetch-add, and move it to this node's PMEM while keeping its address.
bool cross_node(tiermem::Client& client, tiermem::NodeId node) {
  auto a = client.alloc(1 << 20, {.tier = tiermem::Tier::dram, .node = node});
  if (failed(a.status(), "alloc on another node")) return false;
  const std::string text = "written from node " + std::to_string(client.node()) + " into node " +
                           std::to_string(node) + "'s memory";
  if (failed(client.write(a->gva, text.data(), text.size()), "remote write")) return false;
  std::string back(text.size(), '\0');
  if (failed(client.read(a->gva, back.data(), back.size()), "remote read")) return false;
  std::printf("node %u  %s  \"%s\"\n", node, a->gva.to_string().c_str(), back.c_str());
  auto counter = client.alloc(8, {.node = node, .coherent = true});
  if (failed(counter.status(), "alloc counter")) return false;
  uint64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    auto old = client.fetch_add(counter->gva, 1);
    if (failed(old.status(), "fetch_add")) return false;
    last = *old;
  }
  std::printf("node %u  %s  fetch_add x3 -> %llu\n", node, counter->gva.to_string().c_str(),
              static_cast<unsigned long long>(last + 1));
  auto moved = client.migrate(a->gva, tiermem::Tier::pmem, client.node());
  if (failed(moved.status(), "migrate")) return false;
  std::string again(text.size(), '\0');
  if (failed(client.read(a->gva, again.data(), again.size()), "read after migration")) return false;
  std::printf("node %u  %s  migrated to node %u pmem, same GVA reads: %s\n", node, a->gva.to_string().c_str(),
              client.node(), again == text ? "identical" : "MISMATCH");
  return back == text && again == text;
}

}  // namespace

int main() {
  auto client = tiermem::Client::connect({.client_name = "tiermem-example"});
  if (failed(client.status(), "connect")) return 1;
  tiermem::Client& c = **client;

  auto stat = c.stat();
  if (failed(stat.status(), "stat")) return 1;
  std::printf("connected to node %u (tiermemd %s, page size %llu)\n", stat->node,
              stat->daemon_version.c_str(), static_cast<unsigned long long>(stat->page_size));

  bool ok = true;
  for (const tiermem::TierStat& t : stat->tiers) ok = round_trip(c, t.tier) && ok;

  // Zero-copy: map a DRAM allocation and write through the span directly.
  auto shared = c.alloc(1 << 20, {.tier = tiermem::Tier::dram, .name = "example-mapped"});
  if (failed(shared.status(), "alloc")) return 1;
  auto mapping = c.map(shared->gva);
  if (failed(mapping.status(), "map")) return 1;
  std::memcpy(mapping->data(), "hello through a mapping", 24);
  char check[24] = {};
  if (failed(c.read(shared->gva, check, sizeof check), "read")) return 1;
  std::printf("mapped  %s  read back with Client::read: \"%s\"\n", shared->gva.to_string().c_str(), check);
  ok = ok && std::strcmp(check, "hello through a mapping") == 0;

  // Named allocations outlive this process; find one again by name.
  auto found = c.lookup("example-mapped");
  if (failed(found.status(), "lookup")) return 1;
  std::printf("lookup  example-mapped -> %s\n", found->gva.to_string().c_str());

  // The same calls reach memory homed on every other node of the cluster,
  // one-sided through the data plane.
  auto nodes = c.nodes();
  if (failed(nodes.status(), "nodes")) return 1;
  for (const tiermem::NodeInfo& n : *nodes) {
    if (n.state != tiermem::NodeState::connected) continue;
    ok = cross_node(c, n.node) && ok;
  }
  return ok ? 0 : 1;
}
