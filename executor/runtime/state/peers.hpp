// Where the other ranks of the job are (X5): their control words (the
// barrier, the committed step, published gradients) and the mailboxes this
// rank writes, found by name in the job's directory once every rank made them.
#pragma once

#include <map>

#include <tiermem/gva.h>
#include <tiermem/status.h>

#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"

namespace tiermem::exec {

// Where the other ranks' control words and mailboxes are.
struct RankPeers {
  std::map<int, Gva> ctl;   // rank -> its ctl allocation (this rank's own too)
  std::map<int, Gva> mbox;  // outgoing channel id -> the receiver's mailbox
  std::map<int, Gva> tp_mbox;  // rank of this one's tensor-parallel group -> its mailbox
  Gva ctl_word(int rank, size_t word) const { return ctl.at(rank).plus(8 * word); }
};

// Waits (up to the job's timeout) for every rank's ctl and for the mailboxes
// of the stages this one sends to. Errors: timeout naming the rank.
Result<RankPeers> find_peers(JobDirectory& dir, const JobPlan& job, const Arenas& arenas, bool announce);

}  // namespace tiermem::exec
