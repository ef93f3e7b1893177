// Placement policy (M6): which tiers an allocation may land on, in order.
#pragma once

#include <vector>

#include <tiermem/types.h>

namespace tiermem {

// The tiers to try for a request, fastest first. AUTO: VRAM -> DRAM -> PMEM.
// A specific tier: that tier, then (unless strict) the slower ones after it in
// the chain. Strict AUTO is the same as AUTO.
std::vector<Tier> placement_chain(Tier hint, bool strict);

}  // namespace tiermem
