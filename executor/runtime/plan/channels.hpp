// Pipeline topology and the boundary tensors between stages (X5, X6).
//
// rank = replica * stages + stage. A channel carries one tensor from one stage
// to another for every micro-batch: an activation forward, or a partial
// gradient of an activation back to the stage that produced it. Each message
// is a BoundaryHeader followed by the payload, written one-sided into the
// receiver's mailbox slot; then the receiver's sequence word for the channel
// is raised (an atomic on the receiver's node) and the receiver, which waits
// on that word, reads the slot in place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tiermem/status.h>

#include "executor/graph.hpp"
#include "executor/partitioner.hpp"

namespace tiermem::exec {

// rank = (replica * tensor_parallel + tp) * stages + stage: the ranks of a
// tensor-parallel group are `stages` apart, those of a stage's data-parallel
// group stages * tensor_parallel apart.
struct Topology {
  int stages = 1;
  int replicas = 1;
  int tensor_parallel = 1;
  int rank = 0;
  int world() const { return stages * tensor_parallel * replicas; }
  int stage() const { return rank % stages; }
  int tp() const { return (rank / stages) % tensor_parallel; }
  int replica() const { return rank / (stages * tensor_parallel); }
  // The rank at `stage` and `replica` in this rank's place of its
  // tensor-parallel group.
  int rank_of(int stage, int replica) const { return (replica * tensor_parallel + tp()) * stages + stage; }
  // Rank `t` of this rank's tensor-parallel group.
  int tp_peer(int t) const { return (replica() * tensor_parallel + t) * stages + stage(); }
};

struct Channel {
  int id = 0;
  int tensor = -1;  // carried tensor (an activation, or the gradient of one)
  int from = 0;     // stage
  int to = 0;       // stage
  bool forward = true;
  int64_t bytes = 0;
};

// Every channel of the partitioned graph, in the same order on every rank.
std::vector<Channel> channels_of(const Graph& graph, const Partition& partition);

// The X6 header: magic 0x47, element count, dtype, partition, the dims along
// which this piece sits in a larger tensor and its offsets there (none for
// whole tensors), the message's sequence number and the shape hash.
struct BoundaryHeader {
  uint8_t magic = k_magic;
  uint8_t dtype = 0;       // DType
  uint16_t partition = 0;  // the sending stage
  uint32_t offset_dims = 0;  // how many entries of offsets[] are used
  int64_t elements = 0;
  int64_t offset_dim[4] = {};
  int64_t offsets[4] = {};
  uint64_t sequence = 0;
  uint64_t shape_hash = 0;
  static constexpr uint8_t k_magic = 0x47;
};
static_assert(sizeof(BoundaryHeader) <= 128);
inline constexpr int64_t k_header_bytes = 128;  // payload starts here (aligned)

uint64_t shape_hash(const Tensor& tensor);

// Checks a received header against what the receiver expects; the error
// names the tensor.
Status check_header(const BoundaryHeader& h, const Tensor& tensor, int from_stage, uint64_t sequence);

}  // namespace tiermem::exec
