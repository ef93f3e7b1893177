#include "executor/runtime/plan/channels.hpp"

#include <set>

namespace tiermem::exec {

std::vector<Channel> channels_of(const Graph& g, const Partition& p) {
  std::vector<Channel> out;
  std::set<std::tuple<int, int, int>> seen;
  auto add = [&](int tensor, int from, int to, bool forward) {
    if (from == to || !seen.insert({tensor, from, to}).second) return;
    Channel c;
    c.id = static_cast<int>(out.size());
    c.tensor = tensor;
    c.from = from;
    c.to = to;
    c.forward = forward;
    c.bytes = g.tensors[tensor].bytes();
    out.push_back(c);
  };
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    if (op.phase == Phase::update) continue;
    const int here = p.of_op[i];
    // Activations read here but produced on another stage travel forward.
    for (int t : op.in) {
      const Tensor& tensor = g.tensors[t];
      if (tensor.role == Role::activation && tensor.producer >= 0) add(t, p.of_op[tensor.producer], here, true);
    }
    // Gradients of activations written here belong to the activation's
    // producer: partial sums travel back to it.
    if (op.phase == Phase::backward) {
      for (int t : op.out) {
        const Tensor& grad = g.tensors[t];
        if (grad.of_param) continue;
        for (size_t a = 0; a < g.tensors.size(); ++a) {
          if (g.tensors[a].grad == t && g.tensors[a].producer >= 0) {
            add(t, here, p.of_op[g.tensors[a].producer], false);
          }
        }
      }
    }
  }
  return out;
}

uint64_t shape_hash(const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (unsigned char c : t.name) mix(c);
  mix(t.shape.size());
  for (int64_t d : t.shape) mix(static_cast<uint64_t>(d));
  mix(static_cast<uint64_t>(t.dtype));
  return h;
}

Status check_header(const BoundaryHeader& h, const Tensor& t, int from_stage, uint64_t sequence) {
  auto bad = [&](const std::string& why) {
    return Status(ErrorCode::malformed_frame, "boundary message for '" + t.name + "' from stage " +
                                                  std::to_string(from_stage) + ": " + why);
  };
  if (h.magic != BoundaryHeader::k_magic) return bad("magic byte " + std::to_string(h.magic) + " is not 0x47");
  if (h.sequence != sequence) {
    return bad("sequence " + std::to_string(h.sequence) + " where " + std::to_string(sequence) + " was due");
  }
  if (h.partition != from_stage) return bad("sent by partition " + std::to_string(h.partition));
  if (h.elements != t.elements() || h.dtype != static_cast<uint8_t>(t.dtype) || h.shape_hash != shape_hash(t)) {
    return Status(ErrorCode::failed_precondition,
                  "Gradient topology mismatch: '" + t.name + "' arrives with " + std::to_string(h.elements) +
                      " elements (shape hash " + std::to_string(h.shape_hash) + ") but is " + shape_text(t.shape) +
                      " here");
  }
  return Status();
}

}  // namespace tiermem::exec
