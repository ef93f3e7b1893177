// Checks of a decoded request that do not depend on the daemon's state, made
// before anything else looks at it: every enum holds one of its values
// (proto3 enums keep unknown numbers: tier 99 used to be taken as auto, atomic
// op 7 as compare-swap) and every node id fits in 16 bits (65537 used to be
// node 1). Done by reflection over the whole message, so a field added later
// is checked too.
#pragma once

#include <tiermem/status.h>

namespace google::protobuf {
class Message;
}

namespace tiermem {

// Errors: invalid_argument naming the field ("alloc.tier") and the value.
Status check_request_fields(const google::protobuf::Message& request);

}  // namespace tiermem
