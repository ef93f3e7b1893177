#include <cstdio>
#include <string>

#include <tiermem/gva.h>

namespace tiermem {
namespace {

constexpr size_t k_node_digits = 4;
constexpr size_t k_offset_digits = 16;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses exactly `digits` hex characters into *out.
bool parse_hex(std::string_view text, uint64_t* out) {
  uint64_t v = 0;
  for (char c : text) {
    const int d = hex_value(c);
    if (d < 0) return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

Status gva_error(std::string_view text, std::string_view why) {
  return Status(ErrorCode::bad_gva, "'" + std::string(text) + "' is not a GVA: " +
                                        std::string(why) +
                                        " (expected NNNN:OOOOOOOOOOOOOOOO in hex, e.g. "
                                        "0001:00007f8a2b3c4d5e)");
}

}  // namespace

std::string Gva::to_string() const {
  char buf[k_node_digits + 1 + k_offset_digits + 1];
  std::snprintf(buf, sizeof buf, "%04x:%016llx", static_cast<unsigned>(node),
                static_cast<unsigned long long>(offset));
  return buf;
}

Result<Gva> Gva::parse(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return gva_error(text, "no ':' between node and offset");
  const std::string_view node_text = text.substr(0, colon);
  const std::string_view offset_text = text.substr(colon + 1);
  if (node_text.size() != k_node_digits) {
    return gva_error(text, "the node must be exactly 4 hex digits");
  }
  if (offset_text.size() != k_offset_digits) {
    return gva_error(text, "the offset must be exactly 16 hex digits");
  }
  uint64_t node = 0;
  uint64_t offset = 0;
  if (!parse_hex(node_text, &node)) return gva_error(text, "the node is not hexadecimal");
  if (!parse_hex(offset_text, &offset)) return gva_error(text, "the offset is not hexadecimal");
  Gva gva;
  gva.node = static_cast<NodeId>(node);
  gva.offset = offset;
  return gva;
}

}  // namespace tiermem
