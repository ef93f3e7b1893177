#include "executor/memory_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include <tiermem/units.h>

namespace tiermem::exec {
namespace {

// Lowest offset where [offset, offset+bytes) overlaps no placed instance whose
// lifetime overlaps `p`'s.
int64_t first_fit(const std::vector<Placement>& placed, const Placement& p) {
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (const Placement& q : placed) {
    if (q.last < p.first || p.last < q.first) continue;
    busy.push_back({q.offset, q.offset + q.bytes});
  }
  std::sort(busy.begin(), busy.end());
  int64_t offset = 0;
  for (const auto& [start, end] : busy) {
    if (offset + p.bytes <= start) break;
    offset = std::max(offset, end);
  }
  return offset;
}

constexpr int64_t k_align = 64;
constexpr int k_max_prefetch = 4;
int64_t align(int64_t n) { return (n + k_align - 1) / k_align * k_align; }

}  // namespace

const Placement* MemoryPlan::find(int tensor, int micro_batch) const {
  for (const auto* list : {&work, &params, &grads, &optimizer}) {
    for (const Placement& p : *list) {
      if (p.tensor == tensor && (p.micro_batch == micro_batch || p.micro_batch < 0)) return &p;
    }
  }
  return nullptr;
}

int64_t MemoryPlan::total_bytes() const {
  int64_t n = 0;
  for (const ArenaPlan& a : arenas) n += a.bytes * a.copies;
  return n;
}

namespace {

struct StageOps {
  std::vector<int> forward, backward, update;
};

StageOps ops_of(const Graph& g, const Partition& partition, int part) {
  StageOps ops;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (partition.of_op[i] != part) continue;
    (g.ops[i].phase == Phase::forward ? ops.forward : g.ops[i].phase == Phase::backward ? ops.backward : ops.update)
        .push_back(static_cast<int>(i));
  }
  return ops;
}

// 1F1B on stage `part` of `parts`: warm-up forwards, then one backward and
// one forward, then the last backwards; micro-batches in descending order.
void schedule_1f1b(const StageOps& ops, int micro_batches, int part, int parts, MemoryPlan* plan) {
  const int warmup = std::min(parts - 1 - part, micro_batches);
  int forwarded = 0, backwarded = 0;
  auto forward = [&] {
    const int m = micro_batches - 1 - forwarded++;
    for (int op : ops.forward) plan->schedule.push_back({op, m});
  };
  auto backward = [&] {
    const int m = micro_batches - 1 - backwarded++;
    for (int op : ops.backward) plan->schedule.push_back({op, m});
  };
  for (int i = 0; i < warmup; ++i) forward();
  while (forwarded < micro_batches) {
    forward();
    backward();
  }
  while (backwarded < micro_batches) backward();
}

// GPipe: forward of every micro-batch, then backward in reverse order.
// Op-major (offload): each op for every micro-batch in a row, in the same
// orders.
void schedule(const StageOps& ops, int micro_batches, bool op_major, MemoryPlan* plan) {
  if (op_major) {
    for (int op : ops.forward) {
      for (int m = 0; m < micro_batches; ++m) plan->schedule.push_back({op, m});
    }
    for (int op : ops.backward) {
      for (int m = micro_batches - 1; m >= 0; --m) plan->schedule.push_back({op, m});
    }
    return;
  }
  for (int m = 0; m < micro_batches; ++m) {
    for (int op : ops.forward) plan->schedule.push_back({op, m});
  }
  for (int m = micro_batches - 1; m >= 0; --m) {
    for (int op : ops.backward) plan->schedule.push_back({op, m});
  }
}

// Lifetimes of the per-micro-batch tensors this stage touches, keyed by
// (tensor, micro-batch); tensors that arrive from other stages are listed in
// plan->received instead.
std::map<std::pair<int, int>, Placement> lifetimes(const Graph& g, const StageOps& ops, MemoryPlan* plan) {
  std::map<std::pair<int, int>, Placement> live;
  std::vector<bool> produced_here(g.tensors.size(), false);
  for (const auto* list : {&ops.forward, &ops.backward}) {
    for (int op : *list) {
      for (int t : g.ops[op].out) produced_here[t] = true;
    }
  }
  for (size_t pos = 0; pos < plan->schedule.size(); ++pos) {
    const auto [op, m] = plan->schedule[pos];
    auto touch = [&](int t) {
      const Tensor& tensor = g.tensors[t];
      if (!tensor.per_micro_batch()) return;
      // Inputs and labels are loaded here; activations from another stage are
      // read in place from the mailbox they arrive in. Gradients always have
      // a buffer here: partial sums from other stages are added into it.
      const bool loaded = tensor.role == Role::input || tensor.role == Role::label;
      if (!produced_here[t] && !loaded && tensor.role != Role::grad) {
        if (std::find(plan->received.begin(), plan->received.end(), t) == plan->received.end()) {
          plan->received.push_back(t);
        }
        return;
      }
      auto [it, fresh] = live.try_emplace({t, m});
      Placement& p = it->second;
      if (fresh) {
        p.tensor = t;
        p.micro_batch = m;
        p.bytes = align(tensor.bytes());
        p.first = static_cast<int>(pos);
      }
      p.last = static_cast<int>(pos);
    };
    for (int t : g.ops[op].in) touch(t);
    for (int t : g.ops[op].out) touch(t);
  }
  return live;
}

// Tensors this stage sends to another (what runtime/channels.cpp makes
// channels of): an activation read there, a gradient of an activation
// produced there.
std::vector<bool> sent_elsewhere(const Graph& g, const Partition& partition, int part) {
  std::vector<bool> sent(g.tensors.size(), false);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.phase == Phase::update || partition.of_op[i] == part) continue;
    for (int t : op.in) {
      const int producer = g.tensors[t].producer;
      if (g.tensors[t].role == Role::activation && producer >= 0 && partition.of_op[producer] == part) sent[t] = true;
    }
  }
  for (const Tensor& a : g.tensors) {
    if (a.grad < 0 || a.producer < 0 || partition.of_op[a.producer] == part || g.tensors[a.grad].of_param) continue;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      if (partition.of_op[i] != part || op.phase != Phase::backward) continue;
      if (std::find(op.out.begin(), op.out.end(), a.grad) != op.out.end()) sent[a.grad] = true;
    }
  }
  return sent;
}

// Biggest first, each at the lowest offset free over its lifetime.
void place_work(const std::map<std::pair<int, int>, Placement>& live, MemoryPlan* plan) {
  std::vector<Placement> order;
  for (const auto& [key, p] : live) order.push_back(p);
  std::sort(order.begin(), order.end(), [](const Placement& a, const Placement& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.first < b.first;
  });
  for (Placement& p : order) {
    p.offset = first_fit(plan->work, p);
    plan->work.push_back(p);
    plan->work_peak = std::max(plan->work_peak, p.offset + p.bytes);
    plan->work_naive += p.bytes;
  }
}

void stack(std::vector<Placement>& list, int t, int64_t bytes, int64_t* size) {
  Placement p;
  p.tensor = t;
  p.offset = *size;
  p.bytes = align(bytes);
  *size += p.bytes;
  list.push_back(p);
}

// Per-step tensors (parameters, their gradients, optimizer state) and the
// arenas they all live in: the per-step ones in plan->home (the compute tier
// unless offloaded), the work arena (and the window) in plan->compute.
void place_per_step(const Graph& g, const StageOps& ops, MemoryPlan* plan) {
  int64_t params = 0, grads = 0, optimizer = 0;
  size_t states = 2;
  for (int op : ops.update) {
    const Op& u = g.ops[op];
    stack(plan->params, u.in[0], g.tensors[u.in[0]].bytes(), &params);
    stack(plan->grads, u.in[1], g.tensors[u.in[1]].bytes(), &grads);
    states = std::max(states, u.in.size());
  }
  // The state by kind (every first moment, then every second), each in the
  // parameters' order: the updates of parameters side by side find their
  // state side by side too, and run as one call (StageRunner::update).
  for (size_t i = 2; i < states; ++i) {
    for (int op : ops.update) {
      const Op& u = g.ops[op];
      if (i < u.in.size()) stack(plan->optimizer, u.in[i], g.tensors[u.in[i]].bytes(), &optimizer);
    }
  }
  // Where the kernels run: every tensor in VRAM for GPU kernels, else in
  // the fastest tier the CPU addresses (Arenas places them so).
  const Tier home = plan->home, hot = plan->compute;
  plan->arenas = {
      {"params", home, params, 2, "parameters; two copies, the committed step's and the next"},
      {"grads", home, grads, 1, "parameter gradients, summed over micro-batches"},
      {"optimizer", home, optimizer, 2, "optimizer state, committed with the parameters"},
      {"work", hot, plan->work_peak, 1, "activations and their gradients, reused over lifetimes"},
  };
  if (plan->offload) {
    plan->arenas.push_back({"window", hot, plan->window_peak, 1,
                            "parameters streamed in ahead of their ops, gradients until drained home"});
  }
  plan->arenas.push_back({"snapshot", Tier::pmem, params + optimizer, 2,
                          "committed parameters and optimizer state, two slots (--snapshot-every; with --replicas on "
                          "other nodes too)"});
  plan->in_compute_tier = 0;
  for (const ArenaPlan& a : plan->arenas) {
    if (a.tier == hot && a.name != "snapshot") plan->in_compute_tier += a.bytes * a.copies;
  }
}

// Offload: the stays of parameters and their gradients in the window, and
// where they go in it.
void place_visits(const Graph& g, int depth, MemoryPlan* plan) {
  std::map<std::tuple<bool, int, Phase>, Visit> by_key;  // (grad, tensor, phase of a parameter's use)
  for (size_t pos = 0; pos < plan->schedule.size(); ++pos) {
    const Op& op = g.ops[static_cast<size_t>(plan->schedule[pos].first)];
    auto use = [&](int t, bool grad) {
      auto [it, fresh] = by_key.try_emplace({grad, t, grad ? Phase::backward : op.phase});
      Visit& v = it->second;
      if (fresh) {
        v.tensor = t;
        v.grad = grad;
        v.bytes = align(g.tensors[t].bytes());
        v.first = static_cast<int>(pos);
      }
      v.last = static_cast<int>(pos);
    };
    for (int t : op.in) {
      if (g.tensors[t].role == Role::param) use(t, false);
    }
    for (int t : op.out) {
      if (g.tensors[t].role == Role::grad && g.tensors[t].of_param) use(t, true);
    }
  }
  // A parameter's load is issued `depth` stays ahead: before the ops of the
  // stays that start `depth` starting positions before its own.
  std::vector<int> starts;
  for (const auto& [key, v] : by_key) {
    if (!v.grad) starts.push_back(v.first);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<Placement> lives;
  for (auto& [key, v] : by_key) {
    if (!v.grad) {
      auto at = std::lower_bound(starts.begin(), starts.end(), v.first);
      const auto k = at - starts.begin();
      v.load_at = k == 0 ? v.first : starts[static_cast<size_t>(std::max<std::ptrdiff_t>(k - depth, 0))];
    }
    plan->visits.push_back(v);
  }
  // Biggest first, each at the lowest offset free over [load or first, last].
  std::vector<size_t> order(plan->visits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Visit &x = plan->visits[a], &y = plan->visits[b];
    return x.bytes != y.bytes ? x.bytes > y.bytes : std::tie(x.first, x.tensor) < std::tie(y.first, y.tensor);
  });
  for (size_t i : order) {
    Visit& v = plan->visits[i];
    Placement p;
    p.tensor = v.tensor;
    p.bytes = v.bytes;
    p.first = v.grad ? v.first : v.load_at;
    p.last = v.last;
    p.offset = first_fit(lives, p);
    v.offset = p.offset;
    lives.push_back(p);
    plan->window_peak = std::max(plan->window_peak, p.offset + p.bytes);
  }
  std::sort(plan->visits.begin(), plan->visits.end(), [](const Visit& x, const Visit& y) {
    return std::tie(x.first, x.grad, x.tensor) < std::tie(y.first, y.grad, y.tensor);
  });
}

}  // namespace

namespace {

// Offload: the optimizer on the compute's side (param_stream.hpp) updates
// each parameter chunk by chunk in two halves of the window (one loading
// while the other computes): chunks as large as the window holds for the
// steps' stays, at least 4 Ki elements, at most the largest parameter.
void place_update(const Graph& g, const StageOps& ops, MemoryPlan* plan) {
  int64_t largest = 0;
  for (int op : ops.update) {
    const Op& u = g.ops[static_cast<size_t>(op)];
    plan->update_arrays = std::max<int>(plan->update_arrays, static_cast<int>(u.in.size()));
    largest = std::max(largest, g.tensors[u.in[0]].elements());
  }
  if (plan->update_arrays == 0) return;
  const int64_t room = plan->window_peak / (2 * plan->update_arrays * 4) / 16 * 16;
  plan->update_chunk = std::min(largest, std::max<int64_t>(room, 4 << 10));
  plan->window_peak = std::max(plan->window_peak, 2 * plan->update_arrays * align(plan->update_chunk * 4));
}

MemoryPlan plan_with(const Graph& g, const Partition& partition, int part, int micro_batches, bool vram, bool offload,
                     PipelineSchedule pipeline) {
  MemoryPlan plan;
  plan.part = part;
  plan.micro_batches = micro_batches;
  plan.compute = vram ? Tier::vram : Tier::dram;
  plan.offload = offload;
  plan.home = !offload ? plan.compute : vram ? Tier::dram : Tier::pmem;
  plan.pipeline = offload ? PipelineSchedule::gpipe : pipeline;
  if (plan.pipeline == PipelineSchedule::one_f_one_b && partition.parts > 1) {
    if (std::string why = flows_back(g, partition); !why.empty()) {
      plan.pipeline = PipelineSchedule::gpipe;
      plan.schedule_note = "1f1b asked, gpipe run: " + why;
    }
  }
  const StageOps ops = ops_of(g, partition, part);
  if (plan.pipeline == PipelineSchedule::one_f_one_b) {
    schedule_1f1b(ops, micro_batches, part, partition.parts, &plan);
  } else {
    schedule(ops, micro_batches, offload, &plan);
  }
  auto live = lifetimes(g, ops, &plan);
  if (!vram) {
    // On the CPU a boundary message is sent while the next ops run
    // (Mailboxes::send): what it sends stays until the step's end.
    const std::vector<bool> sent = sent_elsewhere(g, partition, part);
    const int end = static_cast<int>(plan.schedule.size()) - 1;
    for (auto& [key, p] : live) {
      if (sent[static_cast<size_t>(p.tensor)]) p.last = std::max(p.last, end);
    }
  }
  place_work(live, &plan);
  if (offload) {
    place_visits(g, 1, &plan);
    place_update(g, ops, &plan);
  }
  place_per_step(g, ops, &plan);
  return plan;
}

// An offloaded plan's stays again, loaded `depth` stays ahead.
MemoryPlan with_depth(const Graph& g, const Partition& partition, const MemoryPlan& base, int depth) {
  MemoryPlan plan = base;
  plan.visits.clear();
  plan.window_peak = 0;
  plan.update_chunk = 0;
  plan.update_arrays = 0;
  plan.prefetch_depth = depth;
  const StageOps ops = ops_of(g, partition, plan.part);
  place_visits(g, depth, &plan);
  place_update(g, ops, &plan);
  place_per_step(g, ops, &plan);
  return plan;
}

}  // namespace

const char* schedule_name(PipelineSchedule s) { return s == PipelineSchedule::one_f_one_b ? "1f1b" : "gpipe"; }

int MemoryPlan::message_index(bool forward, int mb) const {
  if (pipeline == PipelineSchedule::one_f_one_b) return micro_batches - 1 - mb;
  return forward ? mb : micro_batches - 1 - mb;
}

MemoryPlan plan_memory(const Graph& g, const Partition& partition, int part, int micro_batches, bool vram,
                       PipelineSchedule schedule) {
  MemoryPlan plan = plan_with(g, partition, part, micro_batches, vram, false, schedule);
  plan.all_in_compute = plan.in_compute_tier;
  return plan;
}

Result<MemoryPlan> plan_memory(const Graph& g, const Partition& partition, int part, int micro_batches,
                               const MemoryOptions& options) {
  MemoryPlan whole = plan_memory(g, partition, part, micro_batches, options.vram, options.schedule);
  whole.budget = options.budget;
  if (options.budget <= 0 || whole.in_compute_tier <= options.budget) return whole;
  MemoryPlan plan = plan_with(g, partition, part, micro_batches, options.vram, true, PipelineSchedule::gpipe);
  plan.budget = options.budget;
  plan.all_in_compute = whole.in_compute_tier;
  if (plan.in_compute_tier > options.budget) {
    return Status(ErrorCode::tier_exhausted,
                  "stage " + std::to_string(part) + " does not fit a budget of " +
                      format_size(static_cast<uint64_t>(options.budget)) + " of " +
                      std::string(tier_name(plan.compute)) + " even offloaded: its activations take " +
                      format_size(static_cast<uint64_t>(plan.work_peak)) + " and the window its ops' parameters and " +
                      "gradients stream through " + format_size(static_cast<uint64_t>(plan.window_peak)) +
                      "; give it at least " + format_size(static_cast<uint64_t>(plan.in_compute_tier)) +
                      " (or fewer rows per micro-batch, or more stages)");
  }
  // Room left: loads issued further ahead (up to k_max_prefetch stays), so a
  // large parameter behind a short op still arrives in time.
  for (int depth = 2; depth <= k_max_prefetch; ++depth) {
    MemoryPlan deeper = with_depth(g, partition, plan, depth);
    if (deeper.in_compute_tier > options.budget) break;
    plan = std::move(deeper);
  }
  return plan;
}

std::string format_plan(const Graph& g, const MemoryPlan& plan) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "stage %d: %zu scheduled op runs over %d micro-batch(es), %s\n", plan.part,
                plan.schedule.size(), plan.micro_batches,
                plan.offload ? "op-major (offloaded)" : schedule_name(plan.pipeline));
  out += line;
  if (!plan.schedule_note.empty()) out += "  " + plan.schedule_note + "\n";
  for (const ArenaPlan& a : plan.arenas) {
    std::snprintf(line, sizeof line, "  arena %-9s %-4s %10s x%d  %s\n", a.name.c_str(),
                  std::string(tier_name(a.tier)).c_str(), format_size(static_cast<uint64_t>(a.bytes)).c_str(),
                  a.copies, a.purpose.c_str());
    out += line;
  }
  // The peak of each tier: what its arenas hold at once.
  std::map<Tier, int64_t> by_tier;
  for (const ArenaPlan& a : plan.arenas) by_tier[a.tier] += a.bytes * a.copies;
  out += "  peak by tier:";
  for (const auto& [tier, bytes] : by_tier) {
    out += " " + std::string(tier_name(tier)) + " " + format_size(static_cast<uint64_t>(bytes));
  }
  out += "\n";
  if (plan.budget > 0) {
    std::snprintf(line, sizeof line, "  budget %s of %s: %s\n", format_size(static_cast<uint64_t>(plan.budget)).c_str(),
                  std::string(tier_name(plan.compute)).c_str(),
                  plan.offload ? "offloaded" : "everything fits, nothing offloaded");
    out += line;
  }
  if (plan.offload) {
    std::snprintf(line, sizeof line,
                  "  offload: all in %s would take %s (%.1fx the budget); parameters, gradients and optimizer "
                  "state live in %s, %zu stays stream through a %s window, loaded %d ahead (op-major schedule)\n",
                  std::string(tier_name(plan.compute)).c_str(),
                  format_size(static_cast<uint64_t>(plan.all_in_compute)).c_str(),
                  static_cast<double>(plan.all_in_compute) / static_cast<double>(std::max<int64_t>(plan.budget, 1)),
                  std::string(tier_name(plan.home)).c_str(), plan.visits.size(),
                  format_size(static_cast<uint64_t>(plan.window_peak)).c_str(), plan.prefetch_depth);
    out += line;
    // What a step moves between the tiers, and what the optimizer adds on
    // either side (tiermem-exec train --offload-update).
    std::map<int, const Op*> update_of_grad;
    for (const Op& op : g.ops) {
      if (op.phase == Phase::update && op.in.size() >= 2) update_of_grad[op.in[1]] = &op;
    }
    int64_t loads = 0, drains = 0, through = 0;
    for (const Visit& v : plan.visits) {
      const int64_t bytes = g.tensors[static_cast<size_t>(v.tensor)].bytes();
      (v.grad ? drains : loads) += bytes;
      auto it = v.grad ? update_of_grad.find(v.tensor) : update_of_grad.end();
      if (it != update_of_grad.end()) through += bytes * (2 * static_cast<int64_t>(it->second->in.size()) - 1);
    }
    std::snprintf(line, sizeof line,
                  "  a step moves %s in (parameters, each phase) and %s out (gradients); the optimizer adds %s "
                  "through the window on the compute (--offload-update device: every operand in, all but the "
                  "gradient back), none on the host (host; auto splits per parameter by the rates it measures)\n",
                  format_size(static_cast<uint64_t>(loads)).c_str(), format_size(static_cast<uint64_t>(drains)).c_str(),
                  format_size(static_cast<uint64_t>(through)).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  work arena: peak %s with reuse, %s without (%.1fx less)\n",
                format_size(static_cast<uint64_t>(plan.work_peak)).c_str(),
                format_size(static_cast<uint64_t>(plan.work_naive)).c_str(),
                plan.work_peak > 0 ? static_cast<double>(plan.work_naive) / static_cast<double>(plan.work_peak) : 1.0);
  out += line;
  std::snprintf(line, sizeof line, "  %-28s %4s %10s %10s %7s\n", "TENSOR", "MB", "OFFSET", "BYTES", "LIVE");
  out += line;
  for (const Placement& p : plan.work) {
    std::snprintf(line, sizeof line, "  %-28s %4d %10lld %10lld %3d-%-3d\n", g.tensors[p.tensor].name.c_str(),
                  p.micro_batch, static_cast<long long>(p.offset), static_cast<long long>(p.bytes), p.first, p.last);
    out += line;
  }
  // Per-step tensors: their arena, its tier, offset and size.
  const struct {
    const char* arena;
    const std::vector<Placement>* list;
  } per_step[] = {{"params", &plan.params}, {"grads", &plan.grads}, {"optimizer", &plan.optimizer}};
  for (const auto& [arena, list] : per_step) {
    Tier tier = plan.home;
    for (const ArenaPlan& a : plan.arenas) {
      if (a.name == arena) tier = a.tier;
    }
    for (const Placement& p : *list) {
      std::snprintf(line, sizeof line, "  %-28s %-9s %-4s %10lld %10lld\n", g.tensors[p.tensor].name.c_str(), arena,
                    std::string(tier_name(tier)).c_str(), static_cast<long long>(p.offset),
                    static_cast<long long>(p.bytes));
      out += line;
    }
  }
  for (const Visit& v : plan.visits) {
    std::snprintf(line, sizeof line, "  %-28s window    %-4s %10lld %10lld %3d-%-3d %s\n",
                  g.tensors[v.tensor].name.c_str(), std::string(tier_name(plan.compute)).c_str(),
                  static_cast<long long>(v.offset), static_cast<long long>(v.bytes), v.grad ? v.first : v.load_at,
                  v.last, v.grad ? "zeroed, drained home after its last op" : "loaded from home");
    out += line;
  }
  for (int t : plan.received) {
    std::snprintf(line, sizeof line, "  %-28s  from another stage (read in place from the mailbox)\n",
                  g.tensors[t].name.c_str());
    out += line;
  }
  return out;
}

}  // namespace tiermem::exec
