// Global virtual address (GVA): names a byte anywhere in a tiermem cluster.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tiermem/export.h>
#include <tiermem/status.h>

namespace tiermem {

using NodeId = uint16_t;

// 128 bits: the home node that owns the address range, a 64-bit byte offset in
// that node's range, and the generation of the allocation it was handed out
// for. Generation 0 means "not checked" (for example a GVA typed by a person);
// a non-zero generation that no longer matches makes the daemon answer
// stale_generation instead of touching memory of a newer allocation.
//
// Text form (every tool prints and parses it): NNNN:OOOOOOOOOOOOOOOO, the node
// in 4 hex digits and the offset in 16, e.g. 0001:00007f8a2b3c4d5e. The
// generation is not part of the text form.
struct Gva {
  NodeId node = 0;
  uint16_t reserved = 0;
  uint32_t generation = 0;
  uint64_t offset = 0;

  // Offset 0 on any node is never allocated: a zero GVA is "null".
  bool is_null() const { return offset == 0; }

  // The address `bytes` further on, same node and generation.
  Gva plus(uint64_t bytes) const {
    Gva g = *this;
    g.offset += bytes;
    return g;
  }

  TIERMEM_EXPORT std::string to_string() const;

  // Parses the text form. Accepts upper- or lower-case hex; rejects anything
  // else (wrong lengths, missing colon, trailing text) with bad_gva and a
  // message that quotes the input and the expected form.
  TIERMEM_EXPORT static Result<Gva> parse(std::string_view text);

  friend bool operator==(const Gva&, const Gva&) = default;
};
static_assert(sizeof(Gva) == 16, "a GVA is 128 bits");

}  // namespace tiermem
