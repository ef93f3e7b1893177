// Logging set-up (spdlog). One line per event; journald-friendly when stderr
// is the journal (no timestamps of our own, syslog-style <N> level prefixes).
#pragma once

#include <string_view>

#include <tiermem/status.h>

namespace tiermem {

// Configures the default spdlog logger. `level`: trace, debug, info, warn,
// error, critical, off. Errors: invalid_argument for an unknown level.
Status setup_logging(std::string_view level, std::string_view name);

}  // namespace tiermem
