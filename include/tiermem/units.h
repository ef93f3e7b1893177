// Human sizes: "4096", "64KiB", "2MiB", "1GiB" (and KB/MB/GB as powers of 1000),
// as every tiermem tool and config file writes them. Thread-safe, no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <tiermem/export.h>
#include <tiermem/status.h>

namespace tiermem {

// Parses a byte count. Accepts an integer with an optional suffix B, KiB, MiB,
// GiB, TiB (powers of 1024; K, M, G, T, k are accepted as the same) or KB, MB,
// GB, TB (powers of 1000). Errors: invalid_argument naming the input, for
// empty text, unknown suffixes, fractions, negatives and overflow.
TIERMEM_EXPORT Result<uint64_t> parse_size(std::string_view text);

// "64 KiB", "1.5 GiB", "512 B": for people, not for parsing back exactly.
TIERMEM_EXPORT std::string format_size(uint64_t bytes);

// "12.3 GB/s" from bytes and seconds.
TIERMEM_EXPORT std::string format_rate(double bytes_per_second);

}  // namespace tiermem
