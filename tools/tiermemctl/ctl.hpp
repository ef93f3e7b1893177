// Shared pieces of tiermemctl's subcommands: the connection, output in tables
// or JSON, and the one-line error convention.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <tiermem/client.h>

namespace tiermem::ctl {

// Global options, parsed once in main.
struct Context {
  std::string socket;  // empty: $TIERMEM_SOCKET or the default
  bool json = false;
  NodeId node = 0;     // --node: which node status/ls/dump/alloc are about (0: local)
};

// Exit codes: 0 success, 1 the operation failed, 2 bad usage.
inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_failed = 1;
inline constexpr int k_exit_usage = 2;

// Prints "tiermemctl: <what>: <status>" on stderr and returns k_exit_failed;
// with --json (set_json_errors), {"error": {"what", "code", "message"}} on
// stdout instead, so that a machine reading stdout sees it.
int fail(const std::string& what, const Status& status);
// A usage error the same way; returns k_exit_usage.
int usage_error(const std::string& message);
void set_json_errors(bool json);

// Which allocations ls and free --name-prefix/--tenant take; empty: any.
struct Filter {
  std::string name_prefix;
  std::string tenant;
  std::string tier;
  bool any() const { return !name_prefix.empty() || !tenant.empty() || !tier.empty(); }
  bool matches(const AllocationInfo& a) const;
  // Makes `tier` the tier's own name ("DRAM" matched nothing). Errors:
  // invalid_argument for an unknown tier, and for auto, which no
  // allocation is on (the filter would take none, silently).
  Status normalise();
};

// Connects, or prints why not; null on failure.
std::unique_ptr<Client> connect(const Context& ctx);

// Column-aligned text table for people.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : m_rows{std::move(header)} {}
  void add(std::vector<std::string> row) { m_rows.push_back(std::move(row)); }
  std::string render() const;

 private:
  std::vector<std::vector<std::string>> m_rows;
};

void print_json(const nlohmann::json& value);

// Bytes from `gva` to the end of its allocation (what read and write may
// touch). Errors: those of translate().
Result<uint64_t> room_at(Client& client, Gva gva);
// Copies are made in pieces of this size (bounded memory, progress).
inline constexpr size_t k_chunk_bytes = 4 << 20;

nlohmann::json to_json(const AllocationInfo& info);
nlohmann::json to_json(const TierStat& stat);
nlohmann::json to_json(const PageInfo& page, uint64_t page_size, NodeId home);
nlohmann::json to_json(const Extent& extent);

std::string hex(uint64_t value);
std::string percent(uint64_t part, uint64_t whole);
// "1.2s", "3m04s", "2h13m" from milliseconds.
std::string age(uint64_t ms);
std::string version_text(const PageInfo& page);  // "3.12 (locked)"

// Subcommands (one file each).
int cmd_status(const Context& ctx);
int cmd_ls(const Context& ctx, Filter filter);
int cmd_lookup(const Context& ctx, const std::string& name);
int cmd_stats(const Context& ctx, const std::string& prefix, bool buckets);
// free by filter; `dry_run`: only say what would go.
int cmd_free_matching(const Context& ctx, Filter filter, bool dry_run);
// The switches of `alloc` (AllocOptions' of the same names).
struct AllocFlags {
  bool strict = false;
  bool coherent = false;
  bool demotable = false;
};
int cmd_alloc(const Context& ctx, const std::string& size, const std::string& tier,
              const std::string& name, AllocFlags flags, uint32_t replicas, const std::string& qos);
int cmd_free(const Context& ctx, const std::string& gva);
int cmd_write(const Context& ctx, const std::string& gva, const std::string& file);
int cmd_read(const Context& ctx, const std::string& gva, const std::string& length);
int cmd_translate(const Context& ctx, const std::string& gva);
int cmd_dump(const Context& ctx);
int cmd_nodes(const Context& ctx);
int cmd_health(const Context& ctx);
// A training job's allocations by rank and tensor class, and each rank's
// last step report (executor/step_report.hpp).
int cmd_job(const Context& ctx, const std::string& job);
int cmd_migrate(const Context& ctx, const std::string& gva, const std::string& tier);

}  // namespace tiermem::ctl
