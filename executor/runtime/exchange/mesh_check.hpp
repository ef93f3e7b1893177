// The checks every rank makes at start, before training: the shapes of the
// boundary tensors it shares with the others (X6, "Gradient topology
// mismatch"), and the mesh (X8): an all-reduce of a random 1 KiB tensor
// through the memory service whose hash every rank compares, and the
// send/receive round trip to rank 0.
#pragma once

#include <string>

#include <tiermem/client.h>

#include "executor/runtime/state/arenas.hpp"
#include "executor/runtime/state/job.hpp"
#include "executor/runtime/plan/job_plan.hpp"
#include "executor/runtime/exchange/mailboxes.hpp"

namespace tiermem::exec {

// This rank's boundary tensors, one "name shape dtype" line each.
std::string boundary_text(const JobPlan& job);
// Puts boundary_text into this rank's info allocation for the others.
void publish_boundary(const JobPlan& job, const Arenas& arenas);

// Errors: failed_precondition "Gradient topology mismatch" naming the
// tensor, both shapes and both ranks; those of reading the others' info.
Status check_shapes(Client& client, JobDirectory& dir, const JobPlan& job);

// Errors: internal (the hashes differ, naming both ranks), timeout.
// Rank 0 prints the outcome unless `quiet`.
Status validate_mesh(Client& client, JobDirectory& dir, const JobPlan& job, const Arenas& arenas,
                     const RankPeers& peers, const TrainOptions& options, bool resumed);

}  // namespace tiermem::exec
