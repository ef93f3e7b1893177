#include "transport/message_sequence.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <vector>

namespace tiermem::sequence {

void RegionTable::add(uint64_t base, uint64_t length, MemoryKind kind, uint64_t token) {
  std::lock_guard lock(m_lock);
  m_regions[base] = {length, kind, token};
}

void RegionTable::remove(uint64_t base) {
  std::lock_guard lock(m_lock);
  m_regions.erase(base);
}

Refusal RegionTable::check(uint64_t address, uint64_t length, uint64_t token) const {
  std::lock_guard lock(m_lock);
  auto it = m_regions.upper_bound(address);
  if (it == m_regions.begin()) return Refusal::unregistered;
  --it;
  if (address + length < address || address + length > it->first + it->second.length) return Refusal::unregistered;
  if (it->second.token != token) return Refusal::unregistered;
  if (it->second.kind != MemoryKind::host) return Refusal::not_host;
  return Refusal::none;
}

namespace {

Refusal check_one(const Op& op, const RegionTable& regions) {
  switch (op.kind) {
    case OpKind::get:
    case OpKind::put:
    case OpKind::persist:
      if (op.length > k_max_bytes) return Refusal::too_large;
      break;
    case OpKind::atomic:
      if (op.atomic_op > static_cast<uint8_t>(AtomicOp::swap)) return Refusal::malformed;
      [[fallthrough]];
    case OpKind::add_if:
      if (op.length != sizeof(uint64_t)) return Refusal::malformed;
      if (op.address % sizeof(uint64_t) != 0) return Refusal::unaligned;
      break;
    case OpKind::group_end:
    case OpKind::barrier:
      // Touches no memory.
      return op.length == 0 && op.address == 0 ? Refusal::none : Refusal::malformed;
    default:
      return Refusal::malformed;
  }
  return regions.check(op.address, op.length, op.token);
}

// add_if: adds when (word & mask) == value; *seen receives the word.
bool add_if(uint64_t* word, const Op& op, uint64_t* seen) {
  std::atomic_ref<uint64_t> w(*word);
  uint64_t v = w.load(std::memory_order_acquire);
  for (;;) {
    if ((v & op.compare) != op.value) {
      *seen = v;
      return false;
    }
    if (w.compare_exchange_weak(v, v + op.operand, std::memory_order_seq_cst, std::memory_order_acquire)) {
      *seen = v;
      return true;
    }
  }
}

void persist(const Op& op) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = op.address & ~(page - 1);
  // An error means the range is not a file mapping (then there is nothing to
  // persist) or the kernel could not write it back (then neither can we).
  (void)::msync(reinterpret_cast<void*>(start), op.address + op.length - start, MS_SYNC);
}

}  // namespace

Verdict check(std::span<const Op> ops, size_t payload_bytes, const RegionTable& regions) {
  if (ops.empty()) return {Refusal::malformed, 0};
  if (ops.size() > k_max_ops) return {Refusal::too_large, 0};
  size_t puts = 0;
  size_t gets = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (Refusal r = check_one(ops[i], regions); r != Refusal::none) return {r, i};
    if (ops[i].kind == OpKind::put) puts += ops[i].length;
    if (ops[i].kind == OpKind::get) gets += ops[i].length;
    if (puts > k_max_bytes || gets > k_max_bytes) return {Refusal::too_large, i};
  }
  if (puts != payload_bytes) return {Refusal::malformed, ops.size() - 1};
  return {};
}

size_t get_bytes(std::span<const Op> ops, size_t count) {
  size_t n = 0;
  for (size_t i = 0; i < count && i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::get) n += ops[i].length;
  }
  return n;
}

size_t answer_bytes(std::span<const Op> ops) { return ops.size() * sizeof(uint64_t) + get_bytes(ops, ops.size()); }

namespace {

// The first group_end at or after `from`, or ops.size().
size_t group_end_at(std::span<const Op> ops, size_t from) {
  while (from < ops.size() && ops[from].kind != OpKind::group_end) ++from;
  return from;
}

}  // namespace

Outcome run(std::span<const Op> ops, const std::byte* payload, std::byte* answer) {
  auto* results = reinterpret_cast<uint64_t*>(answer);
  std::byte* gets = answer + ops.size() * sizeof(uint64_t);
  std::memset(results, 0, ops.size() * sizeof(uint64_t));
  Outcome out;
  size_t group = 0;       // the first operation of the current group
  bool stopped = false;   // a group since the last barrier was stopped
  for (; out.ran < ops.size(); ++out.ran) {
    const Op& op = ops[out.ran];
    auto* target = reinterpret_cast<std::byte*>(op.address);
    switch (op.kind) {
      case OpKind::get:
        std::memcpy(gets, target, op.length);
        gets += op.length;
        break;
      case OpKind::put:
        std::memcpy(target, payload, op.length);
        payload += op.length;
        break;
      case OpKind::atomic:
        results[out.ran] = cpu_atomic(reinterpret_cast<uint64_t*>(target), static_cast<AtomicOp>(op.atomic_op),
                                      op.operand, op.compare);
        break;
      case OpKind::add_if:
        if (!add_if(reinterpret_cast<uint64_t*>(target), op, &results[out.ran])) {
          // Undone latest first, each by its own amount (a lock is released,
          // not restored: words only ever move forward).
          for (size_t i = out.ran; i-- > group;) {
            if (ops[i].kind != OpKind::add_if) continue;
            std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(ops[i].address))
                .fetch_add(ops[i].undo, std::memory_order_seq_cst);
          }
          const size_t end = group_end_at(ops, out.ran);
          if (end == ops.size()) {
            out.aborted = true;
            return out;
          }
          // The rest of the group is skipped: its puts' bytes passed over,
          // its gets answered with zeros.
          for (size_t i = out.ran + 1; i < end; ++i) {
            if (ops[i].kind == OpKind::put) payload += ops[i].length;
            if (ops[i].kind == OpKind::get) {
              std::memset(gets, 0, ops[i].length);
              gets += ops[i].length;
            }
          }
          results[end] = 1 + (out.ran - group);
          out.ran = end;
          group = end + 1;
          stopped = true;
        }
        break;
      case OpKind::persist:
        persist(op);
        break;
      case OpKind::group_end:
        group = out.ran + 1;
        break;
      case OpKind::barrier:
        if (stopped) {
          results[out.ran] = 1;
          ++out.ran;
          return out;
        }
        group = out.ran + 1;
        break;
    }
    // Each operation completes before the next starts: a message reading
    // words, bytes and the words again sees them in that order.
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  return out;
}

uint64_t cpu_atomic(uint64_t* word, AtomicOp op, uint64_t operand, uint64_t compare) {
  switch (op) {
    case AtomicOp::fetch_add: return __atomic_fetch_add(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::swap: return __atomic_exchange_n(word, operand, __ATOMIC_SEQ_CST);
    case AtomicOp::compare_swap: {
      uint64_t expected = compare;
      __atomic_compare_exchange_n(word, &expected, operand, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return expected;
    }
  }
  return 0;
}

Status refusal_error(Refusal refusal, const Op& op) {
  std::string what;
  ErrorCode code = ErrorCode::out_of_range;
  switch (refusal) {
    case Refusal::unregistered: what = "the range is not in the registered region of the key used"; break;
    case Refusal::unaligned: what = "the atomic word is not 8-byte aligned"; break;
    case Refusal::not_host: what = "the region is device memory, which messages cannot reach"; break;
    case Refusal::too_large:
      what = "more than " + std::to_string(k_max_ops) + " operations or " + std::to_string(k_max_bytes >> 20) +
             " MiB in one message; split the batch";
      code = ErrorCode::invalid_argument;
      break;
    case Refusal::busy:
      what = "the peer's memory for large messages is in use; ask again later";
      code = ErrorCode::busy;
      break;
    case Refusal::unadmitted:
      what = "the connection did not present this node's admission token for its tenant (connect through the "
             "address your daemon hands out)";
      code = ErrorCode::permission_denied;
      break;
    case Refusal::repeated:
      what = "its answer was lost; it ran once (its changes stand) and is not run twice; read again";
      code = ErrorCode::transport_error;
      break;
    default: what = "malformed request"; code = ErrorCode::invalid_argument; break;
  }
  char where[64];
  std::snprintf(where, sizeof where, "0x%llx+%llu", static_cast<unsigned long long>(op.address),
                static_cast<unsigned long long>(op.length));
  return Status(code, std::string("peer refused remote access to ") + where + ": " + what);
}

}  // namespace tiermem::sequence
