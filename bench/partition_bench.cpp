// Partition quality (X3) for every model in config/models: METIS against a
// contiguous greedy split and against random partitions (the median of 101
// seeds), at 2 and 4 stages. Figures per model and stage count: cut bytes per
// micro-batch, FLOP and memory imbalance; ratio: METIS cut / random cut (the
// seed claims 21.6 MB against 128.4 MB, 0.17). Every method partitions the
// graph the trainer runs: heavy matmuls split into column blocks where whole
// ops cannot balance (split_for_balance); METIS on the whole ops is printed
// too, with the floor one op's FLOPs put on its imbalance.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "executor/graph.hpp"
#include "executor/partitioner.hpp"
#include "executor/split.hpp"

using namespace tiermem;
using namespace tiermem::exec;
using tiermem::bench::figure;
using tiermem::bench::median;
using tiermem::bench::note;
using tiermem::bench::ratio;

int main() {
  constexpr int k_micro_batches = 2;
  constexpr int k_random_seeds = 101;
  std::vector<std::filesystem::path> models;
  for (const auto& e : std::filesystem::directory_iterator(std::string(TIERMEM_SOURCE_ROOT) + "/config/models")) {
    if (e.path().extension() == ".pbtxt") models.push_back(e.path());
  }
  std::sort(models.begin(), models.end());
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  };
  for (const auto& path : models) {
    const std::string model = path.stem().string();
    for (int parts : {2, 4}) {
      auto loaded = load_model(path.string());
      if (!loaded.ok()) return fail(loaded.status());
      Graph whole = *loaded, g = std::move(loaded).value();
      auto report = split_for_balance(g, parts, k_micro_batches);
      if (!report.ok()) return fail(report.status());
      for (const std::string& line : *report) note(model + ": " + line);
      for (Graph* graph : {&whole, &g}) {
        if (Status s = add_training(*graph, 1.0f / k_micro_batches); !s.ok()) return fail(s);
      }
      note(model + ", " + std::to_string(parts) + " stages: " + std::to_string(g.ops_of(Phase::forward).size()) +
           " forward ops");
      const std::string base = "partition_" + model + "_" + std::to_string(parts) + "way_";
      auto metis = partition(g, parts, PartitionMethod::metis, k_micro_batches);
      auto greedy = partition(g, parts, PartitionMethod::greedy, k_micro_batches);
      auto metis_whole = partition(whole, parts, PartitionMethod::metis, k_micro_batches);
      if (!metis.ok() || !greedy.ok() || !metis_whole.ok()) continue;  // fewer ops than parts
      std::vector<double> cut, flops, memory;
      for (int seed = 1; seed <= k_random_seeds; ++seed) {
        auto r = partition(g, parts, PartitionMethod::random, k_micro_batches, static_cast<uint64_t>(seed));
        cut.push_back(static_cast<double>(r->cut_bytes));
        flops.push_back(r->flops_imbalance);
        memory.push_back(r->memory_imbalance);
      }
      figure(base + "metis_cut", static_cast<double>(metis->cut_bytes), "bytes");
      figure(base + "greedy_cut", static_cast<double>(greedy->cut_bytes), "bytes");
      figure(base + "random_cut_median", median(cut), "bytes");
      figure(base + "metis_flops_imbalance", 100 * metis->flops_imbalance, "%");
      figure(base + "metis_memory_imbalance", 100 * metis->memory_imbalance, "%");
      figure(base + "greedy_flops_imbalance", 100 * greedy->flops_imbalance, "%");
      figure(base + "random_flops_imbalance_median", 100 * median(flops), "%");
      figure(base + "random_memory_imbalance_median", 100 * median(memory), "%");
      figure(base + "whole_ops_metis_cut", static_cast<double>(metis_whole->cut_bytes), "bytes");
      figure(base + "whole_ops_metis_flops_imbalance", 100 * metis_whole->flops_imbalance, "%");
      figure(base + "whole_ops_flops_imbalance_floor", 100 * flops_imbalance_floor(whole, parts, k_micro_batches), "%");
      ratio(base + "metis_cut_vs_random", median(cut) > 0 ? static_cast<double>(metis->cut_bytes) / median(cut) : 0);
      ratio(base + "metis_cut_vs_greedy",
            greedy->cut_bytes > 0 ? static_cast<double>(metis->cut_bytes) / static_cast<double>(greedy->cut_bytes) : 0);
    }
  }
  return 0;
}
