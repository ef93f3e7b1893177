// Where an offloaded stage's optimizer runs, parameter by parameter
// (--offload-update auto): on the host over the home tier, beside the
// backward pass (no optimizer state crosses the link), or on the compute
// through the window (its gradient, parameter and state in, the new
// parameter and state out: 2k - 1 arrays of the op's k cross the link).
//
// The host takes the parameters whose gradients come home first (they have
// the most backward pass left to hide in), the compute the rest; the cut is
// where the step's tail is shortest:
//   tail(cut) = max(host work - the backward pass it hides in,
//                   the compute's bytes / the link's rate)
// the two running at once after the backward pass; a cut that saves less
// than a tenth of the backward pass is not taken (the two share the host's
// memory bandwidth, which this leaves out) (DeepSpeed's Twin-Flow
// splits by a fixed ratio; this one is measured). The rates are measured on
// the rank (StageRunner: the host's updates of the first step, a copy
// through the window), not assumed.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace tiermem::exec {

struct UpdateOpCost {
  int op = 0;            // the update op
  int64_t elements = 0;  // of its parameter
  int arrays = 0;        // its operands (Adam: parameter, gradient, two moments)
};

struct UpdateRates {
  double host_params_per_s = 0;  // the host's optimizer, measured
  double link_bytes_per_s = 0;   // a copy to and from the window, measured
  double hidden_s = 0;           // backward pass left after the first gradient is home
};

struct UpdateSplit {
  std::set<int> device_ops;  // updated on the compute through the window; the rest on the host
  int64_t host_params = 0, device_params = 0;
  double host_s = 0;         // predicted: the host's work
  double device_s = 0;       // the compute's bytes at the link's rate
  double tail_s = 0;         // past the backward pass
  double all_host_tail_s = 0, all_device_tail_s = 0;
};

// `ops` in the order their gradients come home. `host_share` in [0, 1]:
// the first ops onto the host, as many as that share of the elements
// holds (at most the share); < 0: the shortest tail (ties: more on the host, fewer
// bytes on the link).
UpdateSplit split_updates(const std::vector<UpdateOpCost>& ops, const UpdateRates& rates, double host_share = -1);

// One line for people: the rates, the choice and what each side would take.
std::string describe(const UpdateSplit& split, const UpdateRates& rates, bool forced);

}  // namespace tiermem::exec
