// waker.h - wakes the threads that wait for a request's news, on a thread
// of its own. The engine's thread hands each token to its request under the
// request's lock and posts the request's condition variable here; waking
// the request's connection thread is a system call, and a step of many
// requests would otherwise make that many of them between two steps. The
// waker's own thread is woken once for all the posts that come while it
// works.

#ifndef SMOL_SERVER_WAKER_H
#define SMOL_SERVER_WAKER_H

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace server {

class waker {
  public:
    waker() : thread_([this] { run(); }) {}
    ~waker() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_one();
        thread_.join();
    }
    waker(const waker &) = delete;
    waker & operator=(const waker &) = delete;

    // cv is notified (notify_all) soon; the pointer keeps what owns it alive
    // until then.
    void post(std::shared_ptr<std::condition_variable> cv) {
        bool wake;
        {
            std::lock_guard<std::mutex> lock(mu_);
            posted_.push_back(std::move(cv));
            wake = idle_;
            idle_ = false;
        }
        if (wake) cv_.notify_one();
    }

  private:
    void run() {
        std::vector<std::shared_ptr<std::condition_variable>> batch;
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            if (posted_.empty()) {
                if (stop_) return;
                idle_ = true;
                cv_.wait(lock, [&] { return stop_ || !posted_.empty(); });
                continue;
            }
            batch.swap(posted_);
            lock.unlock();
            for (const auto & c : batch) c->notify_all();
            batch.clear();
            lock.lock();
        }
    }

    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<std::shared_ptr<std::condition_variable>> posted_;
    bool idle_ = false, stop_ = false;
    std::thread thread_; // last: started once the members above exist
};

} // namespace server

#endif
