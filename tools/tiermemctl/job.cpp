// tiermemctl job NAME: a training job's memory (tiermem-exec train --job
// NAME) as the cluster holds it: each rank's tensor classes (parameters,
// gradients, optimizer state, activations, the offload window, ...) with
// the tier and node they live on, and each rank's last step as the rank
// reported it in its own memory (executor/step_report.hpp): its time and,
// offloaded, the bytes that crossed between the home tier and the window.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <tiermem/units.h>

#include "executor/step_report.hpp"
#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

// What each of a rank's allocations holds (executor/runtime/state/arenas.cpp
// names them `<job>.r<rank>.[g<generation>.]<class>`), in the order shown.
struct Class {
  const char* what;
  const char* holds;
};
constexpr Class k_classes[] = {
    {"params", "parameters: the committed step's and the next"},
    {"grads", "parameter gradients, summed over micro-batches"},
    {"optimizer", "optimizer state (Adam's moments), two copies"},
    {"work", "activations and their gradients"},
    {"window", "offload window: parameters streamed in, gradients out"},
    {"mbox", "boundary tensors from other stages"},
    {"publish", "gradients published to the other replicas"},
    {"snapshot", "snapshot of parameters and optimizer state"},
    {"ctl", "control words (barriers, sequences)"},
    {"info", "the rank's reports (mesh check, step report)"},
    {"profile", "measured op costs (the partitioner's)"},
};
constexpr size_t k_class_count = sizeof k_classes / sizeof k_classes[0];

size_t class_index(const std::string& what) {
  for (size_t i = 0; i < k_class_count; ++i) {
    if (what == k_classes[i].what) return i;
  }
  return k_class_count;
}

const char* holds(const std::string& what) {
  const size_t i = class_index(what);
  return i < k_class_count ? k_classes[i].holds : "";
}

struct Entry {
  AllocationInfo info;
  NodeId node = 0;
  int64_t generation = 0;
  std::string what;
};

struct Rank {
  std::vector<Entry> entries;  // of its newest generation
  std::optional<exec::StepReport> report;
  std::string report_error;  // why the report was not read; empty: none yet
};

// `name` split as one of the job's allocations; false when it is not.
bool parse_name(const std::string& job, const std::string& name, int* rank, int64_t* generation, std::string* what) {
  const std::string prefix = job + ".r";
  if (name.rfind(prefix, 0) != 0) return false;
  size_t i = prefix.size(), digits = 0;
  while (i + digits < name.size() && std::isdigit(static_cast<unsigned char>(name[i + digits]))) ++digits;
  if (digits == 0 || digits > 6 || i + digits >= name.size() || name[i + digits] != '.') return false;
  *rank = std::stoi(name.substr(i, digits));
  std::string rest = name.substr(i + digits + 1);
  *generation = 0;
  if (rest.size() > 2 && rest[0] == 'g' && std::isdigit(static_cast<unsigned char>(rest[1]))) {
    const size_t dot = rest.find('.');
    if (dot != std::string::npos && dot < 12) {
      *generation = std::stoll(rest.substr(1, dot - 1));
      rest = rest.substr(dot + 1);
    }
  }
  *what = rest;
  return !rest.empty();
}

// The rank's step report, copied twice (a copy made while the rank wrote
// it differs from the next); nothing and no reason when it has none yet, a
// reason when it could not be read (a refused or failed read, or a report
// that kept changing: a rank dying mid-write leaves it half written).
std::optional<exec::StepReport> read_report(Client& client, Gva info, uint64_t size, std::string* why) {
  if (size < static_cast<uint64_t>(exec::k_step_report_offset) + sizeof(exec::StepReport)) return std::nullopt;
  for (int attempt = 0; attempt < 8; ++attempt) {
    exec::StepReport a, b;
    Status s = client.read(info.plus(exec::k_step_report_offset), &a, sizeof a);
    if (s.ok()) s = client.read(info.plus(exec::k_step_report_offset), &b, sizeof b);
    if (!s.ok()) {
      *why = "not read: " + s.to_string();
      return std::nullopt;
    }
    if (std::memcmp(&a, &b, sizeof a) == 0) {
      if (exec::step_report_valid(a)) return a;
      if (a.magic != exec::k_step_report_magic) return std::nullopt;  // no step yet
    }
  }
  *why = "not read: it changed under 8 pairs of reads or is half written (a rank that died while writing it)";
  return std::nullopt;
}

std::string gib_or_less(int64_t bytes) { return format_size(static_cast<uint64_t>(std::max<int64_t>(bytes, 0))); }

nlohmann::json report_json(const exec::StepReport& r) {
  return {{"steps_done", r.steps_done},         {"total_steps", r.total_steps},
          {"stage", r.stage},                   {"replica", r.replica},
          {"unix_ms", r.unix_ms},               {"step_ms", r.step_ms},
          {"loaded_bytes", r.loaded_bytes},     {"drained_bytes", r.drained_bytes},
          {"updates_beside_backward", r.updates_beside_backward}};
}

}  // namespace

int cmd_job(const Context& ctx, const std::string& job) {
  if (job.empty()) return usage_error("job: NAME is the --job a training was started with");
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto nodes = client->nodes();
  if (!nodes.ok()) return fail("job " + job, nodes.status());
  std::map<int, std::vector<Entry>> all;
  std::vector<std::string> unreachable;
  for (const NodeInfo& n : *nodes) {
    if (n.state != NodeState::self && n.state != NodeState::connected) {
      unreachable.push_back(std::to_string(n.node) + " (" + std::string(node_state_name(n.state)) + ")");
      continue;
    }
    auto list = client->list(n.state == NodeState::self ? 0 : n.node);
    if (!list.ok()) {
      unreachable.push_back(std::to_string(n.node) + " (" + list.status().message() + ")");
      continue;
    }
    for (AllocationInfo& a : *list) {
      Entry e;
      int rank = 0;
      // A copy of another node's allocation carries its name: the home's
      // row counts it.
      if (a.replica_of.node != 0 || !parse_name(job, a.name, &rank, &e.generation, &e.what)) continue;
      e.node = a.gva.node;
      e.info = std::move(a);
      all[rank].push_back(std::move(e));
    }
  }
  if (all.empty()) {
    std::string where = "on the " + std::to_string(nodes->size()) + " node(s) this daemon knows";
    if (!unreachable.empty()) where += " (not asked: " + std::to_string(unreachable.size()) + " not up)";
    return fail("job " + job, Status(ErrorCode::not_found,
                                     "no allocation of a job named '" + job + "' " + where +
                                         ": a job's memory lives while it trains (and after, with --keep), named " +
                                         job + ".r<rank>.<class>; `tiermemctl ls` lists every allocation"));
  }
  std::map<int, Rank> ranks;
  for (auto& [rank, entries] : all) {
    // A re-planned job's older generations are left for the newest.
    int64_t newest = 0;
    for (const Entry& e : entries) {
      if (e.what != "profile") newest = std::max(newest, e.generation);
    }
    Rank& r = ranks[rank];
    for (Entry& e : entries) {
      if (e.what == "profile" || e.generation == newest) r.entries.push_back(std::move(e));
    }
    std::sort(r.entries.begin(), r.entries.end(), [](const Entry& a, const Entry& b) {
      const size_t x = class_index(a.what), y = class_index(b.what);
      return x != y ? x < y : a.what < b.what;
    });
    for (const Entry& e : r.entries) {
      if (e.what == "info") r.report = read_report(*client, e.info.gva, e.info.size, &r.report_error);
    }
  }
  if (ctx.json) {
    nlohmann::json out = {{"job", job}, {"ranks", nlohmann::json::array()}};
    for (const auto& [rank, r] : ranks) {
      nlohmann::json classes = nlohmann::json::array();
      for (const Entry& e : r.entries) {
        classes.push_back({{"class", e.what},
                           {"tier", tier_name(e.info.tier)},
                           {"bytes", e.info.size},
                           {"node", e.node},
                           {"gva", e.info.gva.to_string()},
                           {"generation", e.generation},
                           {"copies", e.info.replicas.size()}});
      }
      out["ranks"].push_back({{"rank", rank},
                              {"classes", classes},
                              {"step", r.report ? report_json(*r.report) : nlohmann::json(nullptr)}});
      if (!r.report_error.empty()) out["ranks"].back()["step_error"] = r.report_error;
    }
    if (!unreachable.empty()) out["nodes_not_asked"] = unreachable;
    print_json(out);
    return k_exit_ok;
  }
  uint64_t total = 0;
  size_t count = 0;
  Table table({"RANK", "CLASS", "TIER", "SIZE", "NODE", "COPIES", "HOLDS"});
  for (const auto& [rank, r] : ranks) {
    for (const Entry& e : r.entries) {
      total += e.info.size;
      ++count;
      table.add({std::to_string(rank), e.what, std::string(tier_name(e.info.tier)), format_size(e.info.size),
                 std::to_string(e.node), std::to_string(e.info.replicas.size()), holds(e.what)});
    }
  }
  std::printf("job %s: %zu rank(s), %zu allocation(s), %s\n", job.c_str(), ranks.size(), count,
              format_size(total).c_str());
  std::fputs(table.render().c_str(), stdout);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  for (const auto& [rank, r] : ranks) {
    if (!r.report) {
      if (r.report_error.empty()) std::printf("rank %d: no step reported yet\n", rank);
      else std::printf("rank %d: step report %s\n", rank, r.report_error.c_str());
      continue;
    }
    const exec::StepReport& s = *r.report;
    std::printf("rank %d (stage %" PRId64 ", replica %" PRId64 "): step %" PRId64 " of %" PRId64
                ", the last took %.2f ms (%s ago)",
                rank, s.stage, s.replica, s.steps_done, s.total_steps, s.step_ms,
                age(static_cast<uint64_t>(std::max<int64_t>(now - s.unix_ms, 0))).c_str());
    if (s.loaded_bytes + s.drained_bytes > 0) {
      std::printf("; offloaded: %s loaded into the window and %s written home a step",
                  gib_or_less(s.loaded_bytes).c_str(), gib_or_less(s.drained_bytes).c_str());
    }
    if (s.updates_beside_backward > 0) {
      std::printf("; %" PRId64 " parameter updates on the host beside the backward pass", s.updates_beside_backward);
    }
    std::printf("\n");
  }
  for (const std::string& n : unreachable) std::printf("node %s not asked\n", n.c_str());
  return k_exit_ok;
}

}  // namespace tiermem::ctl
