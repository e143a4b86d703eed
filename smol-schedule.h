// smol-schedule.h - the program of one graph over a compute stream, two
// copy streams (host-to-device, device-to-host) and a host stream, with the
// events between them, the events of one run, and the copy engine that runs
// the other streams beside the compute stream. Defined in smol-schedule.c++.

#ifndef SMOL_SCHEDULE_H
#define SMOL_SCHEDULE_H

#include "smol-graph.h"

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace smol {

// --- schedule ---------------------------------------------------------------

// The program of one graph over four streams: compute runs every op but
// copies and host nodes, h2d runs host-to-device copies, d2h device-to-host
// ones, host the nodes the host computes and their own copies to and from
// it (tensor::on_host). Within a
// stream instructions run in order; across streams an instruction waits for
// an event that another stream recorded after the node it depends on. Issue
// order is the graph's node order, so a copy placed early in the graph is
// issued early and overlaps the compute that follows it.
enum class stream_id : uint8_t { compute, h2d, d2h, host };
constexpr int n_streams = 4;
const char * stream_name(stream_id s);

struct schedule {
    enum class kind : uint8_t { run, wait, record };
    struct instr {
        kind what;
        int32_t node;  // run: the node
        int32_t event; // wait, record
    };
    std::vector<instr> prog[n_streams];
    // Issue order: (stream, index in that stream's program).
    std::vector<std::pair<uint8_t, int32_t>> issue;
    std::vector<uint8_t> node_stream; // per node
    std::vector<int32_t> event_after; // per node: the event recorded after it, or -1
    std::vector<int32_t> event_node;  // per event: the node it follows
    std::vector<int32_t> event_pos;   // per event: its record's index in its stream
    std::vector<uint8_t> needs_event; // the builder's work space
    int32_t n_events = 0;
    // Whether any stream but compute has work: copies or host nodes.
    bool has_side_work() const { return !prog[1].empty() || !prog[2].empty() || !prog[3].empty(); }
};
stream_id node_stream(const tensor * t);
void make_schedule(const graph & g, schedule & s);
// The program as text, one instruction a line in issue order.
std::string format_schedule(const graph & g, const schedule & s);
// One line naming a node: its op and what it works on ("PREFETCH layer 3
// group 1 -> slot 0: ...", "attention layer 2 kv heads 0-1 (resident)").
std::string describe_node(const tensor * t);

// Events of one run of a schedule, shared by the threads that run its
// streams: record marks one done, wait blocks until it is. A stream that
// fails marks the whole set failed: every wait, now or later, returns false
// at once, so no stream waits for an event that will never come.
class event_set {
  public:
    void reset(int32_t n);
    void record(int32_t e);
    bool wait(int32_t e); // false: the run failed
    void fail();

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<uint8_t> done_;
    bool failed_ = false;
};

// Runs the copy streams and the host stream of a schedule beside the
// executor's compute stream (the simulated device's threads).
class copy_engine {
  public:
    virtual ~copy_engine() = default;
    // Hands over the other streams of s; they run as their waits allow. A
    // copy or host node that fails marks ev failed and ends its stream.
    virtual void start(const graph & g, const schedule & s, event_set & ev) = 0;
    // Returns once those streams have run every instruction or stopped;
    // throws smol::error with the first failure, if one failed.
    virtual void finish() = 0;
};

// Runs one OP_COPY node (a strided memcpy) on the calling thread.
void run_copy_node(const tensor * t);

} // namespace smol

#endif // SMOL_SCHEDULE_H
