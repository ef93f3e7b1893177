// Conversions between the public value types and their protobuf messages.
#pragma once

#include <tiermem/gva.h>
#include <tiermem/status.h>
#include <tiermem/types.h>

#include "access/node_advert.hpp"
#include "control.pb.h"

namespace tiermem::wire {

proto::Tier to_proto(Tier tier);
Tier from_proto(proto::Tier tier);

void to_proto(const Gva& gva, proto::Gva* out);
Gva from_proto(const proto::Gva& gva);

void to_proto(const Status& status, proto::Status* out);
Status from_proto(const proto::Status& status);

void to_proto(const AllocationInfo& info, proto::AllocationInfo* out);
AllocationInfo from_proto(const proto::AllocationInfo& info);

void to_proto(const TierStat& stat, proto::TierInfo* out);
TierStat from_proto(const proto::TierInfo& info);

void to_proto(const PageInfo& page, proto::PageInfo* out);
PageInfo from_proto(const proto::PageInfo& page);

void to_proto(const Extent& extent, proto::Extent* out);
Extent from_proto(const proto::Extent& extent);

// Answers only (a daemon fills the messages from its own state).
NodeInfo from_proto(const proto::NodeInfo& node);
// A client's check-in edge to daemon `node`.
CheckInEdge from_proto(NodeId node, const proto::ClientEdge& edge);
NodeStat from_proto(const proto::StatResponse& stat);
MappingDump from_proto(const proto::DumpResponse& dump);
Translation from_proto(const proto::TranslateResponse& translation);
// What the access layer needs of a node's description.
NodeAdvert advert_of(const proto::NodeInfo& info);

}  // namespace tiermem::wire
