#include "mapping/placement.hpp"

namespace tiermem {

std::vector<Tier> placement_chain(Tier hint, bool strict) {
  std::vector<Tier> chain;
  bool reached = hint == Tier::automatic;
  for (Tier t : k_tiers_fastest_first) {
    if (t == hint) reached = true;
    if (!reached) continue;
    chain.push_back(t);
    if (strict && hint != Tier::automatic) break;
  }
  return chain;
}

}  // namespace tiermem
