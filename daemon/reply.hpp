// What the daemon answers one control request with, and the two replies
// every service of the table of requests starts from.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <tiermem/gva.h>
#include <tiermem/status.h>

#include "control.pb.h"

namespace tiermem {

struct Reply {
  proto::Response response;
  std::vector<int> fds;           // sent with the response (SCM_RIGHTS); not owned
  bool close_after = false;       // protocol error: end the session after replying
  std::function<Reply()> deferred;  // when set: run it (it may block) and send its reply instead
  // The peer `deferred` makes its one request of (0: none, or several):
  // the server takes a slot of that peer (PeerSlots) before the work goes
  // to the pool, waiting without a thread, and the work's call uses it.
  NodeId peer = 0;
};

// A response to `request` (its id, status ok), for a service to fill in.
Reply ok_reply(const proto::Request& request);
// A response carrying only an error; also for frames that could not be
// decoded (id 0). `close_after`: end the session after sending it.
Reply error_reply(uint64_t id, const Status& status, bool close_after);

}  // namespace tiermem
