#include "daemon/reply.hpp"

#include "convert.hpp"

namespace tiermem {

Reply ok_reply(const proto::Request& request) {
  Reply reply;
  reply.response.set_id(request.id());
  wire::to_proto(Status(), reply.response.mutable_status());
  return reply;
}

Reply error_reply(uint64_t id, const Status& status, bool close_after) {
  Reply reply;
  reply.response.set_id(id);
  wire::to_proto(status, reply.response.mutable_status());
  reply.close_after = close_after;
  return reply;
}

}  // namespace tiermem
