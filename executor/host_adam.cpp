// The host's Adam (host_adam.hpp). Compiled with -O3 -ffp-contract=off
// -fno-math-errno (executor/meson.build): the loop vectorises, sqrt is the
// instruction, and no multiply and add fuse, so each clone gives the bits of
// the scalar adam_element.
#include "executor/host_adam.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>

namespace tiermem::exec {
namespace {

// One clone per instruction set; the loader picks the widest this CPU has.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TIERMEM_ADAM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TIERMEM_ADAM_CLONES
#endif

// What every element of one step's update reads, worked out once.
struct Constants {
  float shrink, beta1, beta2, one_b1, one_b2, step_size, c2_sqrt, eps, wd, scale;
};

inline Constants constants_of(const AdamStep& s) {
  return {1.0f - s.lr * s.weight_decay, s.beta1, s.beta2, 1.0f - s.beta1, 1.0f - s.beta2, s.step_size, s.c2_sqrt,
          s.epsilon, s.weight_decay, s.grad_scale};
}

// adam_element, written out (optimizer_math.hpp): the same operations;
// `Decoupled` fixed per instantiation so that the loops have no branch.
struct Element {
  float p, m, v;
};

template <bool Decoupled>
inline Element adam_one(const Constants& k, float p0, float grad, float m0, float v0) {
  const float g0 = grad * k.scale;
  const float p = Decoupled ? p0 * k.shrink : p0;
  const float g = Decoupled ? g0 : g0 + k.wd * p0;
  const float mi = k.beta1 * m0 + k.one_b1 * g;
  const float vi = k.beta2 * v0 + k.one_b2 * g * g;
  return {p - k.step_size * mi / (std::sqrt(vi) / k.c2_sqrt + k.eps), mi, vi};
}

template <bool Decoupled>
inline void adam_loop(const float* __restrict param_in, float* __restrict param, const float* __restrict grad,
                      const float* __restrict m_in, float* __restrict m, const float* __restrict v_in,
                      float* __restrict v, const AdamStep& s, int64_t count) {
  const Constants k = constants_of(s);
  for (int64_t i = 0; i < count; ++i) {
    const Element e = adam_one<Decoupled>(k, param_in[i], grad[i], m_in[i], v_in[i]);
    param[i] = e.p;
    m[i] = e.m;
    v[i] = e.v;
  }
}

// In place (the same arrays in and out) the pointers alias, so they cannot
// be __restrict: each element is read before it is written, which the
// vectoriser proves from the loop's shape.
template <bool Decoupled>
inline void adam_loop_in_place(float* param, const float* __restrict grad, float* m, float* v, const AdamStep& s,
                               int64_t count) {
  const Constants k = constants_of(s);
  for (int64_t i = 0; i < count; ++i) {
    const Element e = adam_one<Decoupled>(k, param[i], grad[i], m[i], v[i]);
    param[i] = e.p;
    m[i] = e.m;
    v[i] = e.v;
  }
}

TIERMEM_ADAM_CLONES void adam_vector(const AdamArrays& a, const AdamStep& s, int64_t begin, int64_t end) {
  const int64_t n = end - begin;
  if (a.param == a.param_in && a.m == a.m_in && a.v == a.v_in) {
    if (s.decoupled) {
      adam_loop_in_place<true>(a.param + begin, a.grad + begin, a.m + begin, a.v + begin, s, n);
    } else {
      adam_loop_in_place<false>(a.param + begin, a.grad + begin, a.m + begin, a.v + begin, s, n);
    }
    return;
  }
  if (s.decoupled) {
    adam_loop<true>(a.param_in + begin, a.param + begin, a.grad + begin, a.m_in + begin, a.m + begin, a.v_in + begin,
                    a.v + begin, s, n);
  } else {
    adam_loop<false>(a.param_in + begin, a.param + begin, a.grad + begin, a.m_in + begin, a.m + begin,
                     a.v_in + begin, a.v + begin, s, n);
  }
}

// Which clone the loader picked, asked the same way it asks.
std::string detect_isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return "avx512f";
  if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
  return "baseline";
}

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) cpus.push_back(-1);
  return cpus;
}

std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

AdamStep adam_step(const OptimizerHyper& h, int64_t step, float grad_scale) {
  AdamStep s{};
  s.lr = learning_rate_at(h, step);
  s.step_size = s.lr / (1.0f - std::pow(h.beta1, static_cast<float>(step)));
  s.c2_sqrt = std::sqrt(1.0f - std::pow(h.beta2, static_cast<float>(step)));
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.epsilon = h.epsilon;
  s.weight_decay = h.weight_decay;
  s.grad_scale = grad_scale;
  s.decoupled = h.decoupled;
  return s;
}

void adam_range(const AdamArrays& a, const AdamStep& s, int64_t begin, int64_t end) {
  if (end > begin) adam_vector(a, s, begin, end);
}

__attribute__((optimize("no-tree-vectorize"))) void adam_range_plain(const AdamArrays& a, const AdamStep& s,
                                                                     int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    adam_element(a.param_in[i], a.grad[i] * s.grad_scale, a.m_in[i], a.v_in[i], s.lr, s.step_size, s.c2_sqrt,
                 s.beta1, s.beta2, s.epsilon, s.weight_decay, s.decoupled, &a.param[i], &a.m[i], &a.v[i]);
  }
}

std::string adam_isa() {
  static const std::string isa = detect_isa();
  return isa;
}

// --- the pool -----------------------------------------------------------------------

HostAdamPool::HostAdamPool(int threads, bool pin) {
  const std::vector<int> cpus = allowed_cpus();
  const int n = threads > 0 ? threads : static_cast<int>(cpus.size());
  // Pinned only where each worker gets a CPU of its own.
  m_pinned = pin && cpus.front() >= 0 && n <= static_cast<int>(cpus.size());
  for (int i = 0; i < n; ++i) m_cpus.push_back(m_pinned ? cpus[static_cast<size_t>(i)] : -1);
  for (int i = 0; i < n; ++i) m_workers.emplace_back([this, i] { work(i, m_cpus[static_cast<size_t>(i)]); });
}

HostAdamPool::~HostAdamPool() {
  {
    std::lock_guard lock(m_mutex);
    m_stop = true;
  }
  m_start.notify_all();
  for (auto& t : m_workers) t.join();
}

std::string HostAdamPool::describe() const {
  std::string out = "Adam on " + std::to_string(threads()) + (threads() == 1 ? " thread" : " threads");
  if (m_pinned) {
    out += " pinned to CPUs ";
    out += cpu_ranges(m_cpus);
  } else {
    out += " (not pinned)";
  }
  out += ", ";
  out += adam_isa();
  return out;
}

void HostAdamPool::adam(const AdamArrays& a, const AdamStep& s, int64_t count) {
  if (count < k_serial_below || m_workers.size() <= 1) {
    adam_range(a, s, 0, count);
    return;
  }
  std::unique_lock lock(m_mutex);
  m_arrays = a;
  m_step = s;
  m_count = count;
  m_running = static_cast<int>(m_workers.size());
  ++m_generation;
  m_start.notify_all();
  m_done.wait(lock, [this] { return m_running == 0; });
}

void HostAdamPool::work(int index, int cpu) {
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // unpinned if refused: still correct
  }
  uint64_t seen = 0;
  const auto parts = static_cast<int64_t>(m_cpus.size());  // filled before any worker starts
  for (;;) {
    AdamArrays a;
    AdamStep s;
    int64_t count;
    {
      std::unique_lock lock(m_mutex);
      m_start.wait(lock, [&] { return m_stop || m_generation != seen; });
      if (m_stop) return;
      seen = m_generation;
      a = m_arrays;
      s = m_step;
      count = m_count;
    }
    // Equal parts on 16-element (64-byte) bounds: no two workers share a
    // cache line of any array.
    const int64_t blocks = (count + 15) / 16;
    const int64_t begin = std::min(count, blocks * index / parts * 16);
    const int64_t end = std::min(count, blocks * (index + 1) / parts * 16);
    adam_range(a, s, begin, end);
    std::lock_guard lock(m_mutex);
    if (--m_running == 0) m_done.notify_one();
  }
}

}  // namespace tiermem::exec
