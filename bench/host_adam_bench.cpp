// The host's Adam (executor/host_adam.hpp) in parameters per second, against
// a plain scalar loop on one thread (the baseline, same run): the vectorised
// loop on one thread, OpenMP's threads over it (every CPU rank's
// kernels::adam) and the pinned pool (an offloaded GPU rank's optimizer).
// Each pass is one AdamW step over --params fp32 parameters in place (reads
// parameter, gradient and both moments, writes three: 28 bytes a parameter).
//
//   host_adam_bench [--params N] [--trials N] [--threads N]
//
// bench/host_adam.sh runs it beside PyTorch's CPU AdamW.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "executor/host_adam.hpp"
#include "executor/kernels.hpp"

namespace b = tiermem::bench;
using namespace tiermem::exec;

int main(int argc, char** argv) {
  int64_t params = int64_t{32} << 20;
  int trials = 7, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--params") params = std::atoll(argv[i + 1]);
    else if (a == "--trials") trials = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: host_adam_bench [--params N] [--trials N] [--threads N]\n");
      return 2;
    }
  }
  if (params < 1 || trials < 1) {
    std::fprintf(stderr, "host_adam_bench: --params and --trials must be at least 1\n");
    return 2;
  }
  const auto n = static_cast<size_t>(params);
  std::vector<float> p(n, 0.01f), g(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int64_t>(i % 2001) - 1000) * 1e-5f;
  OptimizerHyper h;
  h.lr = 3e-4f;
  h.weight_decay = 0.1f;
  h.decoupled = true;
  const AdamArrays a{p.data(), p.data(), g.data(), m.data(), m.data(), v.data(), v.data()};
  int64_t step = 0;
  auto rate = [&](auto&& pass) {
    pass();  // pages touched, threads started
    const double s = b::median_time(trials, pass);
    return static_cast<double>(params) / s;
  };
  HostAdamPool pool(threads, true);
  b::note("parameters " + std::to_string(params) + ", " + std::to_string(trials) + " trials; pool: " +
          pool.describe());
  const double plain = rate([&] { adam_range_plain(a, adam_step(h, ++step, 1.0f), 0, params); });
  const double vector1 = rate([&] { adam_range(a, adam_step(h, ++step, 1.0f), 0, params); });
  const double omp = rate([&] {
    ++step;
    kernels::adam(a.param_in, a.param, a.grad, a.m_in, a.m, a.v_in, a.v, params, h, step, 1.0f);
  });
  const double pooled = rate([&] { pool.adam(a, adam_step(h, ++step, 1.0f), params); });
  b::figure("host_adam_plain_loop_params_per_s", plain, "params/s");
  b::figure("host_adam_vector_1_thread_params_per_s", vector1, "params/s");
  b::figure("host_adam_openmp_params_per_s", omp, "params/s");
  b::figure("host_adam_pool_params_per_s", pooled, "params/s");
  b::figure("host_adam_pool_threads", pool.threads(), "threads");
  b::figure("host_adam_pool_bytes_per_s", pooled * 28, "B/s");
  b::ratio("host_adam_vector_1_thread_vs_plain", vector1 / plain);
  b::ratio("host_adam_pool_vs_plain", pooled / plain);
  b::ratio("host_adam_pool_vs_openmp", pooled / omp);
  b::keep(p[n / 2]);
  return 0;
}
