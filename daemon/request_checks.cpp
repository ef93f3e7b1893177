#include "daemon/request_checks.hpp"

#include <limits>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include "control.pb.h"

#include <string>
#include <vector>

namespace tiermem {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr uint64_t k_max_node = 0xffff;

bool is_node_field(const FieldDescriptor& f) {
  const std::string& n = f.name();
  return n == "node" || n == "to_node" || n == "node_id" || n == "from";
}

Status bad(const std::string& path, const std::string& why) {
  return Status(ErrorCode::invalid_argument, "request field " + path + " " + why);
}

Status check(const Message& m, const std::string& prefix, int depth) {
  if (depth > 8) return bad(prefix, "nests too deep");
  const auto* reflection = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : prefix + "." + f->name();
    const int count = f->is_repeated() ? reflection->FieldSize(m, f) : 1;
    for (int i = 0; i < count; ++i) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_ENUM: {
          const int v = f->is_repeated() ? reflection->GetRepeatedEnumValue(m, f, i) : reflection->GetEnumValue(m, f);
          if (f->enum_type()->FindValueByNumber(v) == nullptr) {
            return bad(path, "is " + std::to_string(v) + ", which is no " + f->enum_type()->name());
          }
          break;
        }
        case FieldDescriptor::CPPTYPE_UINT32: {
          if (!is_node_field(*f)) break;
          const uint32_t v = f->is_repeated() ? reflection->GetRepeatedUInt32(m, f, i) : reflection->GetUInt32(m, f);
          if (v > k_max_node) return bad(path, "is " + std::to_string(v) + ": node ids are 1 to 65535");
          break;
        }
        case FieldDescriptor::CPPTYPE_MESSAGE: {
          const Message& sub = f->is_repeated() ? reflection->GetRepeatedMessage(m, f, i) : reflection->GetMessage(m, f);
          if (Status s = check(sub, path, depth + 1); !s.ok()) return s;
          break;
        }
        default:
          break;
      }
    }
  }
  return Status();
}

}  // namespace

Status check_request_fields(const Message& request) { return check(request, "", 0); }

Status check_frame_length(uint64_t length, bool greeted, uint64_t max_frame_bytes) {
  const uint64_t limit = greeted ? max_frame_bytes : k_greeting_frame_bytes;
  if (length <= limit) return Status();
  return Status(ErrorCode::frame_too_large, "frame of " + std::to_string(length) +
                                                " bytes exceeds the daemon's limit of " + std::to_string(limit) +
                                                " bytes" + (greeted ? " (control.max_frame_bytes)" : " for frames before hello"));
}

Status parse_request(std::string_view body, proto::Request* out) {
  if (body.size() <= static_cast<size_t>(std::numeric_limits<int>::max()) &&
      out->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Status();
  }
  return Status(ErrorCode::malformed_frame,
                "frame of " + std::to_string(body.size()) + " bytes is not a valid tiermem request");
}

}  // namespace tiermem
