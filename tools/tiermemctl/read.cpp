// tiermemctl read GVA LENGTH: the bytes to stdout (base64 in --json).
#include <cstdio>
#include <string>
#include <vector>

#include <tiermem/units.h>

#include "tools/tiermemctl/ctl.hpp"

namespace tiermem::ctl {
namespace {

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
  std::vector<unsigned char> data(*length);
  Status s = client->read(*gva, data.data(), data.size());
  if (!s.ok()) return fail("read " + gva_text, s);
  if (ctx.json) {
    print_json({{"gva", gva->to_string()}, {"length", data.size()}, {"data_base64", base64(data)}});
    return k_exit_ok;
  }
  if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size()) {
    return fail("read", Status(ErrorCode::io_error, "writing to stdout failed"));
  }
  return k_exit_ok;
}

}  // namespace tiermem::ctl
