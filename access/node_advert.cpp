#include "access/node_advert.hpp"

#include "convert.hpp"

namespace tiermem {

NodeAdvert advert_of(const proto::NodeInfo& info) {
  NodeAdvert a;
  a.node = static_cast<NodeId>(info.node_id());
  a.incarnation = info.incarnation();
  a.pages_per_domain = info.pages_per_domain();
  a.transport_address = info.transport_address();
  a.regions_version = info.regions_version();
  for (const proto::RegionKey& k : info.regions()) {
    a.regions.push_back({k.kind() == proto::Region::VERSIONS, wire::from_proto(k.tier()), k.domain(), k.first(),
                         k.base(), k.length(), k.packed_key(), k.persistent(), k.memory_generation()});
  }
  return a;
}

}  // namespace tiermem
