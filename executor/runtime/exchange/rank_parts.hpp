// What the parts of a stage run on: the rank's job and options, its memory
// and its peers', its messages, its trace and its compute. The trainer owns
// them; they outlive every part that holds this.
#pragma once

#include <tiermem/client.h>

#include "executor/compute.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"
#include "executor/runtime/options.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/state/peers.hpp"
#include "executor/trace.hpp"

namespace tiermem::exec {

struct RankParts {
  const JobPlan& job;
  const TrainOptions& options;
  Client& client;
  JobDirectory& dir;
  Arenas& arenas;
  Mailboxes& mail;
  const RankPeers& peers;
  Trace& trace;
  Compute& compute;
};

}  // namespace tiermem::exec
