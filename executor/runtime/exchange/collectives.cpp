#include "executor/runtime/exchange/collectives.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include <tiermem/status_macros.h>

namespace tiermem::exec {
namespace {

constexpr uint64_t k_record_magic = 0x44494c43434e4d54;  // "TMNCCLID"
constexpr size_t k_record_head = 24;                     // magic, nonce, id length
constexpr size_t k_record_sum = k_id_record_bytes - 8;   // the checksum's place

std::string record_name(const GroupSpec& group) { return "nccl-" + group.name; }

uint64_t random_nonce() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return n;
}

std::string who(const GroupSpec& group) {
  std::string ranks;
  for (int r : group.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  return "NCCL group " + group.name + " (ranks " + ranks + ")";
}

// Polls a join until made, failed, given up (`give_up` says why) or the
// deadline.
enum class JoinOutcome { made, failed, superseded, timed_out };
JoinOutcome await_join(Collective& c, std::chrono::steady_clock::time_point deadline,
                       const std::function<bool()>& superseded, Status* error) {
  auto last_look = std::chrono::steady_clock::now();
  for (;;) {
    Result<bool> j = c.joined();
    if (!j.ok()) {
      *error = j.status();
      return JoinOutcome::failed;
    }
    if (*j) return JoinOutcome::made;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) return JoinOutcome::timed_out;
    if (superseded && now - last_look > std::chrono::milliseconds(50)) {
      last_look = now;
      if (superseded()) return JoinOutcome::superseded;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// X8: every member's rank in its place, the plan's fingerprint from all.
Status check_group(Collective& c, const GroupSpec& group, uint64_t fingerprint) {
  std::vector<uint64_t> words(group.ranks.size() + 1, 0);
  words[static_cast<size_t>(group.me)] = static_cast<uint64_t>(group.ranks[static_cast<size_t>(group.me)]) + 1;
  words.back() = fingerprint;
  TIERMEM_ASSIGN_OR_RETURN(const std::vector<uint64_t> sum, c.sum_words(words));
  for (size_t i = 0; i < group.ranks.size(); ++i) {
    if (sum[i] != static_cast<uint64_t>(group.ranks[i]) + 1) {
      return Status(ErrorCode::internal, "mesh validation failed: " + who(group) + ": place " + std::to_string(i) +
                                             " should be rank " + std::to_string(group.ranks[i]) + " but its sum is " +
                                             std::to_string(static_cast<int64_t>(sum[i]) - 1) +
                                             " (members joined at the wrong place)");
    }
  }
  if (sum.back() != fingerprint * group.ranks.size()) {
    return Status(ErrorCode::internal, "mesh validation failed: " + who(group) +
                                           ": the members' plans differ (their gradient buckets or tensor-parallel "
                                           "sums); every rank must run the same model with the same options");
  }
  return Status();
}

}  // namespace

Result<CollectiveAbility> collective_ability(const TrainOptions& options, Compute& compute) {
  if (options.collectives == "tiermem") return CollectiveAbility::tiermem;
  const bool gpu = compute.memory_is_device();
  if (options.collectives == "nccl") {
    if (!gpu) {
      return Status(ErrorCode::invalid_argument, "--collectives nccl needs a GPU rank (--device cuda[:N]); " +
                                                     compute.name() + " reduces through tiermem");
    }
    if (Status s = compute.collectives_available(); !s.ok()) return s.with_context("--collectives nccl");
    return CollectiveAbility::must_nccl;
  }
  if (options.collectives != "auto") {
    return Status(ErrorCode::invalid_argument,
                  "--collectives is auto, nccl or tiermem, not '" + options.collectives + "'");
  }
  if (!gpu) return CollectiveAbility::tiermem;
  return compute.collectives_available().ok() ? CollectiveAbility::nccl : CollectiveAbility::tiermem;
}

std::optional<GroupSpec> dp_group(const Topology& topo) {
  if (topo.replicas < 2) return std::nullopt;
  GroupSpec g;
  g.name = "dp.s" + std::to_string(topo.stage()) + ".t" + std::to_string(topo.tp());
  for (int d = 0; d < topo.replicas; ++d) {
    const int r = topo.rank_of(topo.stage(), d);
    if (r == topo.rank) g.me = static_cast<int>(g.ranks.size());
    g.ranks.push_back(r);
  }
  return g;
}

std::optional<GroupSpec> tp_group(const Topology& topo) {
  if (topo.tensor_parallel < 2) return std::nullopt;
  GroupSpec g;
  g.name = "tp.s" + std::to_string(topo.stage()) + ".d" + std::to_string(topo.replica());
  for (int t = 0; t < topo.tensor_parallel; ++t) {
    const int r = topo.tp_peer(t);
    if (r == topo.rank) g.me = static_cast<int>(g.ranks.size());
    g.ranks.push_back(r);
  }
  return g;
}

uint64_t device_key(const Compute& compute) {
  const std::string uuid = compute.device_uuid();
  return uuid.empty() ? 0 : XXH3_64bits(uuid.data(), uuid.size()) | 1;
}

Result<bool> group_uses_nccl(const GroupSpec& group, const std::vector<CollectiveAbility>& abilities,
                             const std::vector<uint64_t>& devices) {
  int cannot = -1, must = -1;
  for (size_t i = 0; i < abilities.size() && i < group.ranks.size(); ++i) {
    if (abilities[i] == CollectiveAbility::must_nccl && must < 0) must = group.ranks[i];
    if (abilities[i] != CollectiveAbility::nccl && abilities[i] != CollectiveAbility::must_nccl && cannot < 0) {
      cannot = group.ranks[i];
    }
  }
  for (size_t i = 0; i < devices.size() && i < group.ranks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (devices[i] == 0 || devices[i] != devices[j]) continue;
      if (must < 0) return false;
      return Status(ErrorCode::failed_precondition,
                    who(group) + ": ranks " + std::to_string(group.ranks[j]) + " and " + std::to_string(group.ranks[i]) +
                        " compute on the same GPU, and NCCL takes one GPU per member; give each its own "
                        "(--device cuda:N), or --collectives auto to reduce through tiermem");
    }
  }
  if (cannot < 0) return true;
  if (must >= 0) {
    return Status(ErrorCode::failed_precondition,
                  who(group) + ": rank " + std::to_string(must) + " asks for --collectives nccl but rank " +
                      std::to_string(cannot) + " reduces through tiermem (a CPU rank, an offloaded stage or "
                      "--collectives tiermem); give every member of the group a GPU, or --collectives auto");
  }
  return false;
}

Result<Gva> publish_id(JobDirectory& dir, const GroupSpec& group, const IdRecord& record) {
  if (record.id.size() + k_record_head > k_record_sum) {
    return Status(ErrorCode::invalid_argument, "an id of " + std::to_string(record.id.size()) + " bytes does not fit the record");
  }
  TIERMEM_ASSIGN_OR_RETURN(OwnRegion region, dir.own(record_name(group), k_id_record_bytes, AllocOptions{}));
  std::vector<std::byte> bytes(k_id_record_bytes);
  const uint64_t head[3] = {k_record_magic, record.nonce, record.id.size()};
  std::memcpy(bytes.data(), head, sizeof head);
  std::memcpy(bytes.data() + k_record_head, record.id.data(), record.id.size());
  const uint64_t sum = XXH3_64bits(bytes.data(), k_record_head + record.id.size());
  std::memcpy(bytes.data() + k_record_sum, &sum, 8);
  TIERMEM_RETURN_IF_ERROR(dir.write(region.gva, bytes.data(), bytes.size()));
  return region.gva;
}

Result<std::optional<IdRecord>> read_id(JobDirectory& dir, const GroupSpec& group) {
  TIERMEM_ASSIGN_OR_RETURN(Gva at, dir.peer(group.ranks.front(), record_name(group)));
  std::vector<std::byte> bytes(k_id_record_bytes);
  TIERMEM_RETURN_IF_ERROR(dir.read(at, bytes.data(), bytes.size()));
  uint64_t head[3];
  std::memcpy(head, bytes.data(), sizeof head);
  if (head[0] != k_record_magic || head[2] > k_record_sum - k_record_head) return std::optional<IdRecord>();
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + k_record_sum, 8);
  if (sum != XXH3_64bits(bytes.data(), k_record_head + head[2])) return std::optional<IdRecord>();
  IdRecord r;
  r.nonce = head[1];
  r.id.assign(reinterpret_cast<const char*>(bytes.data()) + k_record_head, head[2]);
  return std::optional<IdRecord>(std::move(r));
}

Result<std::unique_ptr<Collective>> make_group(Compute& compute, JobDirectory& dir, const GroupSpec& group,
                                               uint64_t fingerprint, std::chrono::milliseconds timeout) {
  const int size = static_cast<int>(group.ranks.size());
  GroupJoin how;
  how.make_id = [&] { return compute.collective_id(); };
  how.join = [&](const std::string& id) { return compute.join_collective(id, size, group.me, timeout); };
  return make_group(how, dir, group, fingerprint, timeout);
}

Result<std::unique_ptr<Collective>> make_group(const GroupJoin& how, JobDirectory& dir, const GroupSpec& group,
                                               uint64_t fingerprint, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string what = who(group);
  std::unique_ptr<Collective> made;
  if (group.me == 0) {
    TIERMEM_ASSIGN_OR_RETURN(std::string id, how.make_id());
    auto record = publish_id(dir, group, {random_nonce(), id});
    if (!record.ok()) return record.status().with_context(what);
    // Made or given up, the record is not needed any more (a member joins
    // only with it, and the group is made only once every member joined).
    struct Free {
      JobDirectory& dir;
      Gva at;
      ~Free() { (void)dir.client().free(at); }
    } free_record{dir, *record};
    TIERMEM_ASSIGN_OR_RETURN(made, how.join(id));
    Status error;
    switch (await_join(*made, deadline, nullptr, &error)) {
      case JoinOutcome::made: break;
      case JoinOutcome::failed: return error.with_context(what);
      default:
        made->abort();
        return Status(ErrorCode::timeout, what + ": the other members did not join within " +
                                              std::to_string(timeout.count() / 1000) + " s (--timeout)");
    }
  } else {
    const int leader = group.ranks.front();
    uint64_t failed_nonce = 0;
    Status last_error;
    while (!made) {
      if (std::chrono::steady_clock::now() > deadline) {
        return Status(ErrorCode::timeout, what + ": no usable id from rank " + std::to_string(leader) + " within " +
                                              std::to_string(timeout.count() / 1000) + " s (--timeout)" +
                                              (last_error.ok() ? "" : "; the last join failed: " + last_error.message()));
      }
      auto record = read_id(dir, group);
      if (!record.ok()) return record.status().with_context(what);
      if (!record->has_value() || (*record)->nonce == failed_nonce) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      const IdRecord rec = **record;
      TIERMEM_ASSIGN_OR_RETURN(auto joining, how.join(rec.id));
      auto superseded = [&] {
        auto now = read_id(dir, group);
        return now.ok() && now->has_value() && (*now)->nonce != rec.nonce;
      };
      Status error;
      switch (await_join(*joining, deadline, superseded, &error)) {
        case JoinOutcome::made: made = std::move(joining); break;
        case JoinOutcome::failed:
          // The id of the leader's previous start, most likely: wait for a
          // newer record.
          failed_nonce = rec.nonce;
          last_error = error;
          joining.reset();
          break;
        case JoinOutcome::superseded:
        case JoinOutcome::timed_out: joining->abort(); break;
      }
    }
  }
  if (Status s = check_group(*made, group, fingerprint); !s.ok()) {
    made->abort();
    return s;
  }
  return made;
}

}  // namespace tiermem::exec
