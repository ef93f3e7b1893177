// The target side of a message: a sequence of fabric operations (gets, puts,
// 64-bit atomics, conditional adds, persists) on registered memory, checked
// whole before any of it runs, then run in order on this process's memory.
//
// Every transport that carries operations as messages runs them through
// here (UCX over TCP and shared memory, the in-process fake of the tests),
// so what a message may do, and what a malformed one is refused for, exists
// once. Bytes and words only: nothing here knows of pages or versions.
//
// A message on the wire: its operations (Op, 64 bytes each, host order: both
// sides run the same code) followed by the bytes of its puts, in order. Its
// answer: one word per operation (the old value of an atomic or conditional
// add, else 0) followed by the bytes of its gets, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>

#include <tiermem/status.h>

#include "transport/transport.hpp"

namespace tiermem::sequence {

// group_end closes a group: a failing add_if stops the rest of its group only
// (see run()). A message without one is one group. barrier: when a group
// since the previous barrier was stopped, nothing after it runs.
enum class OpKind : uint8_t { get = 1, put = 2, atomic = 3, add_if = 4, persist = 5, group_end = 6, barrier = 7 };

struct Op {
  OpKind kind = OpKind::get;
  uint8_t atomic_op = 0;  // AtomicOp, for kind atomic
  uint16_t reserved0 = 0;
  uint32_t reserved1 = 0;
  uint64_t address = 0;
  uint64_t length = 0;
  uint64_t token = 0;    // of the region the asker holds the key of: the range must lie in it
  uint64_t operand = 0;  // atomic: operand; add_if: what is added
  uint64_t compare = 0;  // atomic: compare-swap's compare; add_if: the condition's mask
  uint64_t value = 0;    // add_if: the condition's value
  uint64_t undo = 0;     // add_if: added back when a later one of the message fails
};
static_assert(sizeof(Op) == 64);

// Why a target refused a message (nothing of it ran).
enum class Refusal : int32_t {
  none = 0,
  unregistered = 1,  // a range outside the region its token names
  unaligned = 2,     // an atomic word not 8-byte aligned
  not_host = 3,      // device memory, which messages cannot reach
  malformed = 4,     // sizes that do not add up, an unknown operation
  too_large = 5,     // more operations or bytes than one message may carry
  busy = 6,          // the target's staging memory for large messages is used up: ask again later
  repeated = 7,      // asked again after its answer was lost, and it read as well as changed memory:
                     // it ran once, and what it read then is gone
  unadmitted = 8,    // the request did not carry the admission token of the listener it came through
};

// What one message may carry (the asker splits a batch into messages by
// these; the target refuses more). A target holds a message's puts and the
// bytes of its gets in memory while it runs it.
inline constexpr size_t k_max_ops = k_message_max_ops;
inline constexpr size_t k_max_bytes = k_message_max_bytes;

// Registered regions by base address. A range is accepted when it lies inside
// the region whose token the operation carries (the token came with the key,
// so holding a key to one region gives nothing of another). Thread-safe.
class RegionTable {
 public:
  void add(uint64_t base, uint64_t length, MemoryKind kind, uint64_t token);
  void remove(uint64_t base);
  Refusal check(uint64_t address, uint64_t length, uint64_t token) const;

 private:
  struct Entry {
    uint64_t length;
    MemoryKind kind;
    uint64_t token;
  };
  mutable std::mutex m_lock;
  std::map<uint64_t, Entry> m_regions;
};

struct Verdict {
  Refusal refusal = Refusal::none;
  size_t op = 0;  // the operation refused
};

// Checks a whole message: every range against `regions`, atomics aligned,
// the puts' bytes adding up to `payload_bytes`, the gets' bytes within
// k_max_bytes.
Verdict check(std::span<const Op> ops, size_t payload_bytes, const RegionTable& regions);

// Bytes of the answer to `ops` (results, then the gets' bytes).
size_t answer_bytes(std::span<const Op> ops);
// Bytes of the gets among the first `count` of `ops`.
size_t get_bytes(std::span<const Op> ops, size_t count);

struct Outcome {
  size_t ran = 0;        // operations run, in order
  bool aborted = false;  // operation `ran` was a conditional add whose condition failed (it ran no add)
};

// Runs checked `ops` in order on this process's memory. Puts take their
// bytes from `payload` in order; `answer` (answer_bytes long) receives one
// word per operation, then the gets' bytes. A conditional add whose
// condition fails stops its group: its word's value goes to its result,
// nothing after it in the group runs (skipped gets answer zeros), and each
// conditional add of the group that ran before it gets its `undo` added
// (latest first). The group's group_end answers 1 + the index in the group
// of the add_if that stopped it (0: the group ran whole), and what follows
// it runs. With no group_end after the failing add_if, the message stops
// there (Outcome::aborted). A barrier after a stopped group answers 1 and
// stops the message there (Outcome::ran is past it, not aborted); else it
// answers 0. Each operation completes before the next
// starts (full fences between them), so a message may read words, bytes and
// words again and compare the two.
Outcome run(std::span<const Op> ops, const std::byte* payload, std::byte* answer);

// A CPU atomic on a word of this process (what one-sided atomics do too, so
// the two are atomic with each other).
uint64_t cpu_atomic(uint64_t* word, AtomicOp op, uint64_t operand, uint64_t compare);

// The error an asker reports for a refusal of its operation `op`.
Status refusal_error(Refusal refusal, const Op& op);

}  // namespace tiermem::sequence
