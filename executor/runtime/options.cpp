#include "executor/runtime/options.hpp"

#include <cstdlib>
#include <string>

namespace tiermem::exec {

RuntimeHooks read_runtime_hooks() {
  RuntimeHooks h;
  struct Step {
    const char* name;
    int64_t* step;
  };
  for (const Step& s : {Step{"TIERMEM_EXEC_STOP_AFTER_COMMIT", &h.stop_after_commit},
                        Step{"TIERMEM_EXEC_STOP_IN_SNAPSHOT", &h.stop_in_snapshot},
                        Step{"TIERMEM_EXEC_STOP_BEFORE_COMMIT", &h.stop_before_commit}}) {
    if (const char* v = std::getenv(s.name); v != nullptr && *v != '\0') *s.step = std::atoll(v);
  }
  const auto set = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  h.stop_in_move = !set("TIERMEM_EXEC_STOP_IN_MOVE").empty();
  h.cpu_buckets = set("TIERMEM_EXEC_CPU_BUCKETS") == "1";
  return h;
}

}  // namespace tiermem::exec
