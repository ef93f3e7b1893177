#include <cctype>
#include <string>

#include <tiermem/types.h>

namespace tiermem {

std::string_view tier_name(Tier tier) {
  switch (tier) {
    case Tier::automatic: return "auto";
    case Tier::vram: return "vram";
    case Tier::dram: return "dram";
    case Tier::pmem: return "pmem";
  }
  return "unknown";
}

Result<Tier> parse_tier(std::string_view text) {
  std::string s;
  for (char c : text) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (Tier t : {Tier::automatic, Tier::vram, Tier::dram, Tier::pmem}) {
    if (s == tier_name(t)) return t;
  }
  return Status(ErrorCode::invalid_argument,
                "unknown tier '" + std::string(text) + "' (use vram, dram, pmem or auto)");
}

std::string_view node_health_name(NodeHealth health) {
  switch (health) {
    case NodeHealth::unknown: return "unknown";
    case NodeHealth::healthy: return "healthy";
    case NodeHealth::degraded: return "degraded";
    case NodeHealth::unreachable: return "unreachable";
  }
  return "unknown";
}

std::string_view qos_class_name(QosClass qos) {
  switch (qos) {
    case QosClass::standard: return "standard";
    case QosClass::strict: return "strict";
    case QosClass::best_effort: return "best_effort";
    case QosClass::graceful_degrade: return "graceful_degrade";
  }
  return "unknown";
}

Result<QosClass> parse_qos_class(std::string_view text) {
  for (QosClass q : {QosClass::standard, QosClass::strict, QosClass::best_effort, QosClass::graceful_degrade}) {
    if (text == qos_class_name(q)) return q;
  }
  return Status(ErrorCode::invalid_argument,
                "'" + std::string(text) + "' is no QoS class (standard, strict, best_effort, graceful_degrade)");
}

std::string_view replica_state_name(ReplicaState state) {
  switch (state) {
    case ReplicaState::in_sync: return "in_sync";
    case ReplicaState::dropped: return "dropped";
  }
  return "unknown";
}

std::string_view node_state_name(NodeState state) {
  switch (state) {
    case NodeState::self: return "self";
    case NodeState::connected: return "connected";
    case NodeState::connecting: return "connecting";
    case NodeState::down: return "down";
  }
  return "unknown";
}

std::string page_flags_text(uint32_t flags) {
  static constexpr struct {
    uint32_t bit;
    char c;
  } k_letters[] = {{k_page_read, 'R'},   {k_page_write, 'W'},   {k_page_coherent, 'C'}, {k_page_pinned, 'P'},
                   {k_page_durable, 'D'}, {k_page_torn, 'T'}, {k_page_lost, 'L'}};
  std::string out;
  for (const auto& l : k_letters) out += (flags & l.bit) ? l.c : '-';
  return out;
}

}  // namespace tiermem
