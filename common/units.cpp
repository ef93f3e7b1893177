#include <array>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>

#include <tiermem/units.h>

namespace tiermem {
namespace {

struct Suffix {
  std::string_view text;
  uint64_t factor;
};

constexpr uint64_t k_kib = 1024;
constexpr std::array<Suffix, 15> k_suffixes = {{
    {"", 1},          {"b", 1},
    {"k", k_kib},     {"kib", k_kib},     {"kb", 1000},
    {"m", k_kib * k_kib}, {"mib", k_kib * k_kib}, {"mb", 1000 * 1000},
    {"g", k_kib * k_kib * k_kib}, {"gib", k_kib * k_kib * k_kib}, {"gb", 1000ull * 1000 * 1000},
    {"t", k_kib * k_kib * k_kib * k_kib}, {"tib", k_kib * k_kib * k_kib * k_kib},
    {"tb", 1000ull * 1000 * 1000 * 1000}, {"bytes", 1},
}};

std::string lower(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return out;
}

Status size_error(std::string_view text, std::string_view why) {
  return Status(ErrorCode::invalid_argument,
                "invalid size '" + std::string(text) + "': " + std::string(why) +
                    " (expected e.g. 4096, 64KiB, 2MiB, 1GiB)");
}

}  // namespace

Result<uint64_t> parse_size(std::string_view text) {
  const std::string s = lower(text);
  if (s.empty()) return size_error(text, "empty");
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), number);
  if (ec == std::errc::result_out_of_range) return size_error(text, "number too large");
  if (ec != std::errc() || end == s.data()) return size_error(text, "does not start with a whole number");
  const std::string_view suffix(end, static_cast<size_t>(s.data() + s.size() - end));
  for (const Suffix& candidate : k_suffixes) {
    if (candidate.text != suffix) continue;
    if (number > std::numeric_limits<uint64_t>::max() / candidate.factor) {
      return size_error(text, "more than 2^64 bytes");
    }
    return number * candidate.factor;
  }
  return size_error(text, "unknown unit '" + std::string(suffix) + "'");
}

std::string format_size(uint64_t bytes) {
  static constexpr std::array<const char*, 5> k_units = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024.0 && unit + 1 < k_units.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0 || value == static_cast<double>(static_cast<uint64_t>(value))) {
    std::snprintf(buf, sizeof buf, "%.0f %s", value, k_units[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, k_units[unit]);
  }
  return buf;
}

std::string format_rate(double bytes_per_second) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB/s", bytes_per_second / 1e9);
  return buf;
}

}  // namespace tiermem
