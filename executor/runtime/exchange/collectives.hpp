// Collectives between GPU ranks through NCCL (X7, X8, X12): which groups a
// rank belongs to, how each is made with the memory service as the
// rendezvous, and the check that it is wired the way the plan says.
//
// Groups: the data-parallel group of a rank is the ranks of its stage and
// tensor-parallel place in every replica (they all-reduce parameter
// gradients); its tensor-parallel group is the ranks of its stage and
// replica (they sum partial tensors). A group reduces through NCCL when
// every member computes on a GPU (--collectives auto, the default) or when
// asked (--collectives nccl: a member that cannot is an error naming it);
// else through tiermem as before (stage.cpp, tp_exchange.cpp). Each rank
// publishes what it can do in its info allocation; every member reads every
// other's, so all decide alike.
//
// Rendezvous: the group's leader (its lowest rank) makes an id at every
// start and writes it, with a fresh random nonce and a checksum, into its
// allocation "<job>.r<leader>.nccl-<group>". The others read the record and
// join with its id. The leader frees the record once the group is made
// (every member joined: NCCL's join ends only then) or given up; one left
// by a leader that died is written over at its next start. A member that read the record of the leader's previous
// start (the leader is restarting) fails to join or waits; it watches the
// record while it does and joins again with the new id once the nonce
// changes. Every wait ends at the job's --timeout with the group named.
//
// Check (X8): once made, each group sums words in one collective: each
// member its job rank in its own place, and everyone the plan's
// fingerprint for the group (its gradient buckets, or its tensor-parallel
// sums). Every member must see each rank in its place and the fingerprint
// times the group's size, or the start fails saying which.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/compute.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/options.hpp"

namespace tiermem::exec {

// What a rank can do, published in its info allocation (k_info_collectives).
enum class CollectiveAbility : uint64_t {
  unknown = 0,  // not published (yet)
  tiermem = 1,  // reduces through tiermem only (a CPU rank, --collectives tiermem)
  nccl = 2,     // on a GPU with NCCL (--collectives auto)
  must_nccl = 3,  // --collectives nccl
};

// This rank's ability from its options and compute. Errors: invalid_argument
// for --collectives nccl where NCCL cannot be (a CPU rank, a build without).
Result<CollectiveAbility> collective_ability(const TrainOptions& options, Compute& compute);

struct GroupSpec {
  std::string name;        // "dp.s1.t0", "tp.s0.d1"
  std::vector<int> ranks;  // job ranks, ascending
  int me = 0;              // this rank's place in `ranks`
};
// This rank's data-parallel and tensor-parallel groups (nullopt: a group of one).
std::optional<GroupSpec> dp_group(const Topology& topo);
std::optional<GroupSpec> tp_group(const Topology& topo);

// A hash of the compute's GPU (0: the CPU), published beside the ability.
uint64_t device_key(const Compute& compute);

// Whether `group` reduces through NCCL, from its members' abilities and
// device keys (in the order of group.ranks; two members on one GPU cannot
// be one NCCL group: NCCL refuses it). Errors: failed_precondition naming a
// member that cannot while another must.
Result<bool> group_uses_nccl(const GroupSpec& group, const std::vector<CollectiveAbility>& abilities,
                             const std::vector<uint64_t>& devices = {});

// The leader's record of a group's id.
struct IdRecord {
  uint64_t nonce = 0;
  std::string id;
};
inline constexpr size_t k_id_record_bytes = 4096;
// The leader writes `record` into its allocation for `group` (created on
// first use) and returns where it is. Errors: those of the directory;
// invalid_argument for an id that does not fit.
Result<Gva> publish_id(JobDirectory& dir, const GroupSpec& group, const IdRecord& record);
// The leader's record as it is now: nullopt while there is none or it is
// torn (a write in progress: its checksum does not match).
Result<std::optional<IdRecord>> read_id(JobDirectory& dir, const GroupSpec& group);

// Makes the group: publishes (leader) or follows (the others) the id and
// joins, as above. `fingerprint`: the plan's, checked across the group.
// Errors: timeout naming the group and the member awaited, internal for a
// failed check, the library's.
Result<std::unique_ptr<Collective>> make_group(Compute& compute, JobDirectory& dir, const GroupSpec& group,
                                               uint64_t fingerprint, std::chrono::milliseconds timeout);
// The same with the id's making and the join given (the compute's, or a
// test's).
struct GroupJoin {
  std::function<Result<std::string>()> make_id;
  std::function<Result<std::unique_ptr<Collective>>(const std::string& id)> join;
};
Result<std::unique_ptr<Collective>> make_group(const GroupJoin& how, JobDirectory& dir, const GroupSpec& group,
                                               uint64_t fingerprint, std::chrono::milliseconds timeout);

// A rank's groups that reduce through NCCL (null: through tiermem).
struct RankCollectives {
  std::unique_ptr<Collective> dp, tp;
};

}  // namespace tiermem::exec
