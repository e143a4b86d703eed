// access.c++ - smol-server's API keys (access.h).

#include "access.h"

#include <fstream>
#include <stdexcept>

namespace server {

bool same_secret(const std::string & a, const std::string & b) {
    unsigned diff = unsigned(a.size() ^ b.size());
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
        const unsigned char x = a.empty() ? 0 : static_cast<unsigned char>(a[i % a.size()]);
        const unsigned char y = b.empty() ? 0 : static_cast<unsigned char>(b[i % b.size()]);
        diff |= unsigned(x ^ y);
    }
    return diff == 0;
}

bool authorized(const std::vector<std::string> & keys, const std::string & header) {
    const std::string bearer = "Bearer ";
    if (header.compare(0, bearer.size(), bearer) != 0) return false;
    const std::string given = header.substr(bearer.size());
    bool ok = false;
    for (const std::string & k : keys) ok = same_secret(given, k) || ok;
    return ok;
}

std::vector<std::string> read_keys(const std::string & path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read the API key file '" + path + "'");
    std::vector<std::string> keys;
    std::string line;
    while (std::getline(in, line)) {
        const size_t a = line.find_first_not_of(" \t\r");
        if (a == std::string::npos || line[a] == '#') continue;
        const size_t b = line.find_last_not_of(" \t\r");
        keys.push_back(line.substr(a, b - a + 1));
    }
    if (keys.empty()) throw std::runtime_error("the API key file '" + path + "' holds no key");
    return keys;
}

bool is_loopback(const std::string & host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

} // namespace server
