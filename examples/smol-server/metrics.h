// metrics.h - what smol-server's Prometheus /metrics shows: the engine's
// figures (smol_engine_stats), and the server's own: histograms of the
// time to the first token, per output token and in the queue, requests by
// finish reason, constrained and tool-call counts, HTTP errors and clients
// that went away.

#ifndef SMOL_SERVER_METRICS_H
#define SMOL_SERVER_METRICS_H

#include "smol.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace server {

// A Prometheus histogram of seconds; observed from any thread.
class histogram {
  public:
    explicit histogram(std::vector<double> bounds);
    void observe(double seconds);
    // The histogram in Prometheus' text format.
    std::string text(const char * name, const char * help) const;

  private:
    std::vector<double> bounds_;
    mutable std::mutex mu_;
    std::vector<uint64_t> counts_;
    double sum_ = 0;
    uint64_t n_ = 0;
};

struct server_metrics {
    histogram first_token{{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
    histogram per_token{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
    histogram queue_wait{{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
    // Requests the engine ended, by how: stop, length, cancelled, error.
    std::atomic<int64_t> finished[5] = {};
    std::atomic<int64_t> tool_call_replies{0}, tool_calls{0};
    std::atomic<int64_t> constrained{0}; // requests whose output follows a grammar
    std::atomic<int64_t> http_errors{0}, disconnects{0};
};

// The /metrics page: the engine's figures s, then the server's m.
std::string metrics_text(const smol_engine_stats & s, const server_metrics & m);

} // namespace server

#endif // SMOL_SERVER_METRICS_H
