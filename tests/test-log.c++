// test-log.c++ - where the library's messages go: a callback installed with
// smol_log_set gets each one with its level and nothing reaches stderr;
// NULL restores stderr with its "smol: " prefix; one-time notices are
// remembered per message.

#include "smol-log.h"
#include "smol.h"

#include <cstdio>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

struct heard {
    std::vector<std::pair<smol_log_level, std::string>> lines;
};

void keep(smol_log_level level, const char * text, void * user_data) {
    static_cast<heard *>(user_data)->lines.emplace_back(level, text);
}

// What f writes to stderr (fd 2), read back from a temporary file.
template <class F> std::string stderr_of(F && f) {
    std::fflush(stderr);
    char name[] = "/tmp/smol-test-log-XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    const int saved = dup(2);
    dup2(fd, 2);
    f();
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    std::string text;
    char buf[256];
    lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
    close(fd);
    unlink(name);
    return text;
}

} // namespace

TEST_CASE("an installed log callback gets each message with its level and stderr gets none") {
    heard h;
    const std::string err = stderr_of([&] {
        smol_log_set(keep, &h);
        smol::log_error("an error for the callback");
        smol::log_warn("a warning for the callback");
        smol::log_info("a notice for the callback");
        smol_log_set(nullptr, nullptr);
    });
    CHECK(err.empty());
    REQUIRE(h.lines.size() == 3);
    CHECK(h.lines[0].first == SMOL_LOG_ERROR);
    CHECK(h.lines[0].second == "an error for the callback");
    CHECK(h.lines[1].first == SMOL_LOG_WARN);
    CHECK(h.lines[1].second == "a warning for the callback");
    CHECK(h.lines[2].first == SMOL_LOG_INFO);
    CHECK(h.lines[2].second == "a notice for the callback");
}

TEST_CASE("without a callback each message goes to stderr after \"smol: \"") {
    heard h;
    smol_log_set(keep, &h);
    smol_log_set(nullptr, nullptr);
    const std::string err = stderr_of([] { smol::log_warn("a line for stderr"); });
    CHECK(err == "smol: a line for stderr\n");
    CHECK(h.lines.empty());
}

TEST_CASE("a one-time notice is said once, and a different one after it is said too") {
    heard h;
    const std::string err = stderr_of([&] {
        smol_log_set(keep, &h);
        CHECK(smol::say_once(SMOL_LOG_INFO, "the first one-time notice"));
        CHECK_FALSE(smol::say_once(SMOL_LOG_INFO, "the first one-time notice"));
        CHECK(smol::say_once(SMOL_LOG_WARN, "the second one-time notice"));
        CHECK_FALSE(smol::say_once(SMOL_LOG_WARN, "the second one-time notice"));
        CHECK_FALSE(smol::say_once(SMOL_LOG_INFO, "the first one-time notice"));
        smol_log_set(nullptr, nullptr);
    });
    CHECK(err.empty());
    REQUIRE(h.lines.size() == 2);
    CHECK(h.lines[0].first == SMOL_LOG_INFO);
    CHECK(h.lines[0].second == "the first one-time notice");
    CHECK(h.lines[1].first == SMOL_LOG_WARN);
    CHECK(h.lines[1].second == "the second one-time notice");
}
