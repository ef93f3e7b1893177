// The relative difference of two tensors, |a - b| / |b| in 2-norms (double
// sums): how the kernel tests compare a result with its reference.
#pragma once

#include <cmath>
#include <vector>

namespace tiermem::test {

inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace tiermem::test
