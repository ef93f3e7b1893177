#include "daemon/copy_writer.hpp"

#include <algorithm>

#include <tiermem/status_macros.h>

#include "convert.hpp"
#include "daemon/data_plane.hpp"
#include "daemon/peer_access.hpp"
#include "daemon/peer_manager.hpp"
#include "pages/seqlock_copy.hpp"

namespace tiermem {
namespace {

// Translations kept at most; past it the cache starts again (a copy freed
// by its home is forgotten when it is seen gone; this bounds the rest).
constexpr size_t k_max_layouts = 65536;

}  // namespace

CopyWriter::CopyWriter(PeerManager& peers, const DataPlane* plane, const DaemonConfig& config, uint64_t page_size)
    : m_peers(peers), m_plane(plane), m_config(config), m_page_size(page_size) {}

Result<std::shared_ptr<const CopyWriter::Layout>> CopyWriter::layout(const ReplicaInfo& copy, const Identity& who,
                                                                      bool fresh) {
  const Key key{copy.node, copy.gva.offset};
  if (!fresh) {
    std::lock_guard lock(m_mutex);
    if (auto it = m_layouts.find(key); it != m_layouts.end()) return it->second;
  }
  auto t = m_peers.stub(copy.node, who, /*by_home=*/true, std::chrono::milliseconds(m_config.peer_timeout_ms))
               .translate_for_cache(copy.gva);
  if (!t.ok()) {
    std::lock_guard lock(m_mutex);
    m_layouts.erase(key);
    return t.status();
  }
  auto l = std::make_shared<Layout>();
  l->incarnation = t->home_incarnation();
  l->first_page = t->first_page_index();
  l->size = t->allocation().size();
  for (const auto& x : t->extents()) l->extents.push_back(wire::from_proto(x));
  l->page_versions.assign(t->page_versions().begin(), t->page_versions().end());
  std::lock_guard lock(m_mutex);
  if (m_layouts.size() >= k_max_layouts) m_layouts.clear();
  m_layouts[key] = l;
  return std::shared_ptr<const Layout>(l);
}

Status CopyWriter::write_once(const ReplicaInfo& copy, const Layout& l, uint64_t offset, const void* data,
                              size_t length) {
  // Each one-sided wait bounded as a request to the copy's daemon is
  // (cluster.peer_timeout_ms), not by the transport's longer timeout: an
  // unreachable copy's node is judged (dropped or the write refused) as soon
  // as before.
  PeerAccess access(&m_peers, transport_of(m_plane),
                    std::chrono::milliseconds(std::min(m_config.peer_timeout_ms, m_config.transport_timeout_ms)));
  TIERMEM_RETURN_IF_ERROR(access.expect_incarnation(copy.node, l.incarnation));
  for (const Extent& x : l.extents) {
    if (x.gva_offset >= offset + length || x.gva_offset + x.length <= offset) continue;
    if (x.node != copy.node) {
      // Frames the copy's node borrowed elsewhere (this node's among them):
      // its daemon writes those.
      return Status(ErrorCode::not_supported, "the copy " + copy.gva.to_string() + " has frames on node " +
                                                  std::to_string(x.node));
    }
    TIERMEM_RETURN_IF_ERROR(access.ensure_frames(x.node, x.tier, x.frame_offset, x.length));
  }
  const LayoutView view{copy.node, l.first_page, m_page_size, l.size, l.extents, l.page_versions,
                        copy.gva.offset % m_page_size};
  return copy_through_layout(view, access, offset, static_cast<std::byte*>(const_cast<void*>(data)), length,
                             /*to_memory=*/true, std::chrono::milliseconds(m_config.peer_timeout_ms));
}

Status CopyWriter::write(const ReplicaInfo& copy, uint64_t offset, const void* data, size_t length,
                         const Identity& who) {
  if (m_plane == nullptr) return Status(ErrorCode::not_supported, "no data plane");
  bool fresh = false;
  Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    TIERMEM_ASSIGN_OR_RETURN(auto l, layout(copy, who, fresh));
    s = write_once(copy, *l, offset, data, length);
    // A copy that moved or was made anew, or a node that restarted since
    // its translation: asked again.
    if (s.ok() || !(is_stale(s) || s.code() == ErrorCode::unavailable)) return s;
    fresh = true;
  }
  return s;
}

}  // namespace tiermem
