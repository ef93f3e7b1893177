#include "executor/update_split.hpp"

#include <algorithm>
#include <cstdio>

namespace tiermem::exec {
namespace {

constexpr double k_split_margin = 0.1;

// Bytes of one parameter's update through the link: every operand in, every
// one but the gradient back.
double link_bytes(const UpdateOpCost& c) { return 4.0 * static_cast<double>(c.elements) * (2 * c.arrays - 1); }

std::string millions(int64_t n) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f M", static_cast<double>(n) / 1e6);
  return text;
}

}  // namespace

UpdateSplit split_updates(const std::vector<UpdateOpCost>& ops, const UpdateRates& rates, double host_share) {
  const size_t n = ops.size();
  // host[k]: the first k ops' elements; device[k]: the rest's link bytes.
  std::vector<double> host(n + 1, 0), device(n + 1, 0);
  for (size_t i = 0; i < n; ++i) host[i + 1] = host[i] + static_cast<double>(ops[i].elements);
  for (size_t i = n; i-- > 0;) device[i] = device[i + 1] + link_bytes(ops[i]);
  const double host_rate = std::max(rates.host_params_per_s, 1.0), link_rate = std::max(rates.link_bytes_per_s, 1.0);
  auto tail = [&](size_t k) {
    return std::max({host[k] / host_rate - rates.hidden_s, device[k] / link_rate, 0.0});
  };
  size_t cut = n;
  if (host_share >= 0) {
    const double want = std::min(host_share, 1.0) * host[n];
    cut = 0;
    while (cut < n && host[cut + 1] <= want * (1 + 1e-12)) ++cut;
  } else {
    for (size_t k = n; k-- > 0;) {
      if (tail(k) < tail(cut)) cut = k;
    }
    // The host's updates and the window's copies share the host's memory
    // bandwidth, which the model leaves out: a split must shorten the tail
    // by a tenth of the backward pass it hides in, or every parameter stays
    // on the host (an H100 with 16 cores: a predicted 2.4 ms gain in a 40 ms
    // backward pass measured 3.6 ms slower).
    if (cut < n && tail(cut) > tail(n) - k_split_margin * rates.hidden_s) cut = n;
  }
  UpdateSplit s;
  for (size_t i = cut; i < n; ++i) s.device_ops.insert(ops[i].op);
  s.host_params = static_cast<int64_t>(host[cut]);
  s.device_params = static_cast<int64_t>(host[n] - host[cut]);
  s.host_s = host[cut] / host_rate;
  s.device_s = device[cut] / link_rate;
  s.tail_s = tail(cut);
  s.all_host_tail_s = tail(n);
  s.all_device_tail_s = tail(0);
  return s;
}

std::string describe(const UpdateSplit& s, const UpdateRates& r, bool forced) {
  char text[512];
  std::snprintf(text, sizeof text,
                "the optimizer %s: %s parameters on the host, %s through the window; measured: the host's Adam "
                "%.2f G parameters/s, the link %.1f GB/s, %.1f ms of backward pass to hide host work in; predicted "
                "%.1f ms past the backward pass (all on the host %.1f ms, all through the window %.1f ms)",
                forced ? "as asked (--offload-host-share)" : "where the step is shortest (--offload-update auto)",
                millions(s.host_params).c_str(), millions(s.device_params).c_str(), r.host_params_per_s / 1e9,
                r.link_bytes_per_s / 1e9, 1e3 * r.hidden_s, 1e3 * s.tail_s, 1e3 * s.all_host_tail_s,
                1e3 * s.all_device_tail_s);
  return text;
}

}  // namespace tiermem::exec
