// Adam and AdamW on the host, fast: the update loop vectorised for the
// widest instruction set the CPU has (AVX-512F, AVX2, else the baseline;
// chosen once at load by the compiler's function clones), and a pool of
// worker threads, each pinned to one of the CPUs this process may use, that
// splits a tensor between them. An offloaded rank whose kernels run on a GPU
// updates its parameters with it (ZeRO-Offload's and torchao's way: fp32
// masters and Adam's state in DRAM); every CPU rank's Adam runs the same
// vectorised loop (kernels::adam).
//
// Every path gives the bits of optimizer_math.hpp's adam_element, element by
// element: the same IEEE operations in the same order (no fused
// multiply-add: this code compiles with -ffp-contract=off; sqrt and division
// are correctly rounded in every instruction set), whatever the threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor/optimizer_math.hpp"

namespace tiermem::exec {

// The arrays of one update: parameter, Adam's first and second moments, each
// read from `*_in` and written to the other (the same array updates in
// place), and the gradient.
struct AdamArrays {
  const float* param_in;
  float* param;
  const float* grad;
  const float* m_in;
  float* m;
  const float* v_in;
  float* v;
};

// What one step's update reads besides its arrays (from OptimizerHyper and
// the step): plain values, the same for every element.
struct AdamStep {
  float lr, step_size, c2_sqrt, beta1, beta2, epsilon, weight_decay, grad_scale;
  bool decoupled;
};
AdamStep adam_step(const OptimizerHyper& h, int64_t step, float grad_scale);

// Elements [begin, end) on the calling thread, vectorised.
void adam_range(const AdamArrays& a, const AdamStep& s, int64_t begin, int64_t end);
// The same elements as a plain scalar loop (not vectorised): the baseline a
// benchmark measures the vectorised loop and the pool against.
void adam_range_plain(const AdamArrays& a, const AdamStep& s, int64_t begin, int64_t end);
// The instruction set adam_range runs with on this CPU: "avx512f", "avx2"
// or "baseline".
std::string adam_isa();

// Worker threads that run adam_range over parts of one tensor. The caller
// waits while they work (it is not one of them): with `pin`, worker i runs
// on the i-th CPU of the process's affinity mask only. Tensors under
// k_serial_below elements run on the caller (waking the workers costs more).
class HostAdamPool {
 public:
  static constexpr int64_t k_serial_below = int64_t{1} << 15;
  // threads <= 0: one per CPU of the process's affinity mask.
  explicit HostAdamPool(int threads = 0, bool pin = true);
  ~HostAdamPool();
  HostAdamPool(const HostAdamPool&) = delete;
  HostAdamPool& operator=(const HostAdamPool&) = delete;

  void adam(const AdamArrays& a, const AdamStep& s, int64_t count);
  int threads() const { return static_cast<int>(m_workers.size()); }
  bool pinned() const { return m_pinned; }
  // "AdamW on 16 threads pinned to CPUs 0-15 (avx512f)": for a log line.
  std::string describe() const;

 private:
  void work(int index, int cpu);

  std::vector<std::thread> m_workers;
  std::vector<int> m_cpus;
  bool m_pinned = false;
  std::mutex m_mutex;
  std::condition_variable m_start, m_done;
  uint64_t m_generation = 0;  // one per adam() call: the workers' start signal
  int m_running = 0;          // workers still on this generation's parts
  bool m_stop = false;
  AdamArrays m_arrays{};
  AdamStep m_step{};
  int64_t m_count = 0;
};

}  // namespace tiermem::exec
