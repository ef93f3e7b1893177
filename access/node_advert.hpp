// A node's description on the wire (proto::NodeInfo) as the access layer
// needs it to reach the node one-sided.
#pragma once

#include "access/remote_memory.hpp"
#include "control.pb.h"

namespace tiermem {

NodeAdvert advert_of(const proto::NodeInfo& info);

}  // namespace tiermem
