// Rank and world size of this process (X5), from the variables the usual
// launchers set: TIERMEM_RANK/TIERMEM_WORLD_SIZE, RANK/WORLD_SIZE (torchrun),
// OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI), SLURM_PROCID/SLURM_NTASKS.
#pragma once

#include <string>

#include <tiermem/status.h>

namespace tiermem::exec {

struct RankEnv {
  int rank = 0;
  int world = 1;
  std::string source = "defaults";  // which variables gave them
};

// Errors: invalid_argument (not a number, rank outside the world).
Result<RankEnv> rank_from_environment();

}  // namespace tiermem::exec
