#include "executor/runtime/env.hpp"

#include <cstdlib>

namespace tiermem::exec {

Result<RankEnv> rank_from_environment() {
  static const char* const k_pairs[][2] = {{"TIERMEM_RANK", "TIERMEM_WORLD_SIZE"},
                                           {"RANK", "WORLD_SIZE"},
                                           {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                           {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& pair : k_pairs) {
    const char* rank = std::getenv(pair[0]);
    const char* world = std::getenv(pair[1]);
    if (rank == nullptr || world == nullptr) continue;
    RankEnv env;
    char* end = nullptr;
    env.rank = static_cast<int>(std::strtol(rank, &end, 10));
    if (*rank == '\0' || *end != '\0') {
      return Status(ErrorCode::invalid_argument, std::string(pair[0]) + "='" + rank + "' is not a number");
    }
    env.world = static_cast<int>(std::strtol(world, &end, 10));
    if (*world == '\0' || *end != '\0' || env.world < 1) {
      return Status(ErrorCode::invalid_argument, std::string(pair[1]) + "='" + world + "' is not a positive number");
    }
    if (env.rank < 0 || env.rank >= env.world) {
      return Status(ErrorCode::invalid_argument, std::string(pair[0]) + "=" + rank + " is outside a world of " + world);
    }
    env.source = std::string(pair[0]) + "/" + pair[1];
    return env;
  }
  return RankEnv{};
}

}  // namespace tiermem::exec
