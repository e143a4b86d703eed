// smol-log.c++ - the log sink (the callback of smol_log_set, or stderr) and
// the set of one-time notices already said.

#include "smol-log.h"

#include "smol-error.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace smol {

namespace {

struct sink {
    std::mutex mu;
    smol_log_callback cb = nullptr;
    void * user_data = nullptr;
    std::set<std::string> said; // the one-time notices given so far
};

sink & the_sink() {
    static sink s;
    return s;
}

} // namespace

void log(smol_log_level level, const std::string & text) {
    sink & s = the_sink();
    smol_log_callback cb;
    void * user_data;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        cb = s.cb;
        user_data = s.user_data;
    }
    // Outside the lock, so a callback may log or install another.
    if (cb) {
        cb(level, text.c_str(), user_data);
    } else {
        std::fprintf(stderr, "smol: %s\n", text.c_str());
    }
}

bool say_once(smol_log_level level, const std::string & text) {
    sink & s = the_sink();
    {
        std::lock_guard<std::mutex> lock(s.mu);
        if (!s.said.insert(text).second) return false;
    }
    log(level, text);
    return true;
}

void assert_failed(const char * file, int line, const char * msg, const char * cond) {
    log_error(std::string(file) + ":" + std::to_string(line) + ": " + msg + " (" + cond + ")");
    std::abort();
}

} // namespace smol

extern "C" void smol_log_set(smol_log_callback cb, void * user_data) {
    smol::sink & s = smol::the_sink();
    std::lock_guard<std::mutex> lock(s.mu);
    s.cb = cb;
    s.user_data = user_data;
}
