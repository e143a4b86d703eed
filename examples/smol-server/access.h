// access.h - who may use smol-server and how connections are served: API
// keys (compared in a time that depends on the lengths only, read from
// the command line or a file), whether an address is loopback, and the
// pool of connection threads that grows with the clients holding
// connections open.

#ifndef SMOL_SERVER_ACCESS_H
#define SMOL_SERVER_ACCESS_H

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <httplib.h>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace server {

// Whether a and b are equal, in a time that depends on their lengths only.
bool same_secret(const std::string & a, const std::string & b);
// Whether the Authorization header carries one of the keys ("Bearer KEY").
// Every key is compared, whichever matches.
bool authorized(const std::vector<std::string> & keys, const std::string & header);
// The keys of a file: one a line, blank lines and lines starting with #
// skipped, spaces around a key dropped. Throws std::runtime_error.
std::vector<std::string> read_keys(const std::string & path);
bool is_loopback(const std::string & host);

// cpp-httplib serves a connection on one thread from its accept until it
// closes, so a client that is slow to send its request (or sends it a byte
// at a time) holds a thread. A fixed pool of a few threads is then taken
// by a few hundred such clients and honest requests wait behind them. This
// pool starts a thread whenever every thread is busy, up to a cap, beyond
// which connections wait for one to end; threads stay for later
// connections.
class connection_pool final : public httplib::TaskQueue {
  public:
    explicit connection_pool(size_t max_threads) : max_(std::max<size_t>(1, max_threads)) {}
    ~connection_pool() override { shutdown(); }

    void enqueue(std::function<void()> fn) override {
        std::unique_lock<std::mutex> lock(mu_);
        jobs_.push_back(std::move(fn));
        if (idle_ < jobs_.size() && threads_.size() < max_) {
            ++idle_;
            threads_.emplace_back([this] { work(); });
        }
        cv_.notify_one();
    }
    void shutdown() override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stop_) return;
            stop_ = true;
        }
        cv_.notify_all();
        for (std::thread & t : threads_) t.join();
    }

  private:
    void work() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return; // stopping, nothing left to serve
            std::function<void()> fn = std::move(jobs_.front());
            jobs_.pop_front();
            --idle_;
            lock.unlock();
            fn();
            lock.lock();
            ++idle_;
        }
    }

    const size_t max_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> jobs_;
    std::vector<std::thread> threads_;
    size_t idle_ = 0; // threads waiting for a connection
    bool stop_ = false;
};

} // namespace server

#endif // SMOL_SERVER_ACCESS_H
