// smol-log.h - where the library's messages go: the callback smol_log_set
// installs (by default stderr, each line after "smol: "), and one-time
// notices that a process says once however many contexts repeat them.

#ifndef SMOL_LOG_H
#define SMOL_LOG_H

#include "smol.h"

#include <string>

namespace smol {

// Sends one line (no newline) to the installed callback or to stderr.
void log(smol_log_level level, const std::string & text);
inline void log_error(const std::string & text) {
    log(SMOL_LOG_ERROR, text);
}
inline void log_warn(const std::string & text) {
    log(SMOL_LOG_WARN, text);
}
inline void log_info(const std::string & text) {
    log(SMOL_LOG_INFO, text);
}

// Logs a message the first time this process says it: once per distinct
// text, not once per context. Returns whether it was said now.
bool say_once(smol_log_level level, const std::string & text);

} // namespace smol

#endif // SMOL_LOG_H
