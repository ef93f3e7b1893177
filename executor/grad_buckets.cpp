#include "executor/grad_buckets.hpp"

#include <algorithm>
#include <map>

#include <tiermem/units.h>

namespace tiermem::exec {

std::vector<GradBucket> plan_grad_buckets(const Graph& graph, const MemoryPlan& plan, int64_t bucket_bytes) {
  std::vector<GradBucket> buckets;
  if (plan.grads.empty()) return buckets;
  const int last_pos = plan.schedule.empty() ? 0 : static_cast<int>(plan.schedule.size()) - 1;
  // The last position writing each gradient (one never written: the end).
  std::map<int, int> ready;
  for (const Placement& p : plan.grads) ready[p.tensor] = -1;
  for (size_t pos = 0; pos < plan.schedule.size(); ++pos) {
    const Op& op = graph.ops[static_cast<size_t>(plan.schedule[pos].first)];
    for (int t : op.out) {
      if (auto it = ready.find(t); it != ready.end()) it->second = static_cast<int>(pos);
    }
  }
  std::vector<const Placement*> grads;
  for (const Placement& p : plan.grads) grads.push_back(&p);
  std::sort(grads.begin(), grads.end(), [](const Placement* a, const Placement* b) { return a->offset > b->offset; });
  GradBucket open;
  int64_t end = 0;
  auto close = [&] {
    if (open.tensors.empty()) return;
    open.bytes = end - open.offset;
    buckets.push_back(open);
    open = GradBucket();
  };
  for (const Placement* p : grads) {
    const int at = ready[p->tensor] < 0 ? last_pos : ready[p->tensor];
    if (!open.tensors.empty() && end - p->offset > bucket_bytes) close();
    if (open.tensors.empty()) {
      end = p->offset + p->bytes;
      open.ready = at;
    }
    open.offset = p->offset;
    open.ready = std::max(open.ready, at);
    open.tensors.push_back(p->tensor);
  }
  close();
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const GradBucket& a, const GradBucket& b) { return a.ready < b.ready; });
  return buckets;
}

std::string describe_buckets(const std::vector<GradBucket>& buckets) {
  std::string out = std::to_string(buckets.size()) + " gradient bucket(s):";
  for (const GradBucket& b : buckets) {
    out += " " + format_size(static_cast<uint64_t>(b.bytes)) + " after op " + std::to_string(b.ready) + ";";
  }
  if (!buckets.empty()) out.pop_back();
  return out;
}

}  // namespace tiermem::exec
