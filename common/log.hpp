// Logging set-up (spdlog). One line per event; journald-friendly when stderr
// is the journal (no timestamps of our own, syslog-style <N> level prefixes).
#pragma once

#include <string_view>

#include <tiermem/status.h>

namespace tiermem {

// Configures the default spdlog logger. `level`: trace, debug, info, warn,
// error, critical, off. Errors: invalid_argument for an unknown level.
Status setup_logging(std::string_view level, std::string_view name);
// Changes the level of the logger set up above (SIGHUP). Errors: as above.
Status set_log_level(std::string_view level);
// Whether stderr is the journal: JOURNAL_STREAM ("device:inode", set by
// systemd) names the file stderr is. A child of a unit that redirected its
// stderr elsewhere inherits the variable, not the journal.
bool stderr_is_journal();

}  // namespace tiermem
