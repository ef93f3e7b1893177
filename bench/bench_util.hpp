// Helpers shared by the benchmarks: timing, medians, and the output
// convention (`name value unit` per figure, `name_ratio value` per ratio).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace tiermem::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

inline void figure(const std::string& name, double value, const char* unit) {
  std::printf("%s %.4g %s\n", name.c_str(), value, unit);
  std::fflush(stdout);
}

inline void ratio(const std::string& name, double value) {
  std::printf("%s_ratio %.3f\n", name.c_str(), value);
  std::fflush(stdout);
}

inline void note(const std::string& text) {
  std::printf("# %s\n", text.c_str());
  std::fflush(stdout);
}

// Runs `fn` `reps` times, returns the median of its timings in seconds.
template <typename Fn>
double median_time(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double start = now_seconds();
    fn();
    t.push_back(now_seconds() - start);
  }
  return median(t);
}

// Keeps the compiler from dropping a computed value.
template <typename T>
inline void keep(const T& value) {
  asm volatile("" : : "g"(&value) : "memory");
}

}  // namespace tiermem::bench
