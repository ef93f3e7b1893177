// tiermemctl read GVA LENGTH: the bytes to stdout (base64 in --json).
//
// LENGTH is checked against the allocation before anything is allocated
// here, and the bytes are copied in pieces, so reading a large allocation
// costs k_chunk_bytes of memory, not its size.
#include <cstdio>
#include <string>
#include <vector>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

// --json holds the bytes in memory (as base64 in one document): this much.
constexpr uint64_t k_json_limit = 64 << 20;

std::string base64(const std::vector<unsigned char>& in) {
  static constexpr char k_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const uint32_t b = static_cast<uint32_t>(in[i]) << 16 |
                       (i + 1 < in.size() ? static_cast<uint32_t>(in[i + 1]) << 8 : 0) |
                       (i + 2 < in.size() ? in[i + 2] : 0);
    out += k_alphabet[b >> 18 & 63];
    out += k_alphabet[b >> 12 & 63];
    out += i + 1 < in.size() ? k_alphabet[b >> 6 & 63] : '=';
    out += i + 2 < in.size() ? k_alphabet[b & 63] : '=';
  }
  return out;
}

}  // namespace

int cmd_read(const Context& ctx, const std::string& gva_text, const std::string& length_text) {
  auto gva = Gva::parse(gva_text);
  if (!gva.ok()) return fail("read", gva.status());
  auto length = parse_size(length_text);
  if (!length.ok()) return fail("read", length.status());
  auto client = connect(ctx);
  if (!client) return k_exit_failed;
  auto room = room_at(*client, *gva);
  if (!room.ok()) return fail("read " + gva_text, room.status());
  if (*length > *room) {
    return fail("read " + gva_text,
                Status(ErrorCode::out_of_range, "asked for " + format_size(*length) + " but only " +
                                                    format_size(*room) + " lie between " + gva->to_string() +
                                                    " and the end of its allocation"));
  }
  if (*length == 0 && !ctx.json) {
    // Nothing failed, but an empty stdout alone would read as empty memory.
    std::fprintf(stderr, "tiermemctl: read %s: LENGTH is 0: nothing was read\n", gva_text.c_str());
    return k_exit_ok;
  }
  if (ctx.json) {
    if (*length > k_json_limit) {
      return fail("read " + gva_text, Status(ErrorCode::invalid_argument,
                                             "--json holds at most " + format_size(k_json_limit) +
                                                 " of data; read without --json (raw bytes) for more"));
    }
    std::vector<unsigned char> data(*length);
    Status s = client->read(*gva, data.data(), data.size());
    if (!s.ok()) return fail("read " + gva_text, s);
    print_json({{"gva", gva->to_string()}, {"length", data.size()}, {"data_base64", base64(data)}});
    return k_exit_ok;
  }
  std::vector<unsigned char> chunk(std::min<uint64_t>(*length, k_chunk_bytes));
  for (uint64_t done = 0; done < *length;) {
    const size_t n = std::min<uint64_t>(chunk.size(), *length - done);
    Status s = client->read(gva->plus(done), chunk.data(), n);
    if (!s.ok()) return fail("read " + gva_text + " at offset " + std::to_string(done), s);
    if (std::fwrite(chunk.data(), 1, n, stdout) != n) {
      return fail("read", Status(ErrorCode::io_error, "writing to stdout failed"));
    }
    done += n;
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
