// smol-error.h - the exception the library's C++ core throws for every
// failure a caller must hear about; the C API turns it into a smol_status and
// the thread's last-error message.

#ifndef SMOL_ERROR_H
#define SMOL_ERROR_H

#include "smol.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace smol {

struct error : std::runtime_error {
    smol_status status;
    error(smol_status s, const std::string & message) : std::runtime_error(message), status(s) {}
};

// The integer a caller stored in a C enum: C lets any int through, and C++
// may not read a value outside an enum's range as that enum, so the C API
// reads its enum arguments through this before it checks them.
template <class E> int c_enum(const E & e) {
    static_assert(sizeof(E) == sizeof(int), "a C enum is an int");
    int v;
    std::memcpy(&v, &e, sizeof v);
    return v;
}

// Sets this thread's smol_last_error() message.
void set_last_error(const std::string & message);

// Runs f for a C API call: every exception becomes a status and a message,
// so nothing throws across the C boundary.
template <class F> smol_status guard(F && f) noexcept {
    try {
        f();
        set_last_error("");
        return SMOL_OK;
    } catch (const error & e) {
        set_last_error(e.what());
        return e.status;
    } catch (const std::bad_alloc &) {
        set_last_error("out of memory");
        return SMOL_ERR_OUT_OF_MEMORY;
    } catch (const std::exception & e) {
        set_last_error(e.what());
        return SMOL_ERR_BACKEND;
    }
}

// Logs a failed SMOL_ASSERT_MSG (smol-log.c++) and aborts.
[[noreturn]] void assert_failed(const char * file, int line, const char * msg, const char * cond);

} // namespace smol

// For programmer errors only: conditions no input can cause.
#define SMOL_ASSERT_MSG(cond, msg)                                                                 \
    do {                                                                                           \
        if (!(cond)) smol::assert_failed(__FILE__, __LINE__, msg, #cond);                          \
    } while (0)

#endif // SMOL_ERROR_H
