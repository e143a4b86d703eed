// bench-cpu-kernels.c++ - a micro-benchmark of the CPU matmul kernels on the
// shapes of SmolLM2-135M (hidden 576, FFN 1536, 3 of 9 heads for k and v,
// 30 layers, 49152-row output head), random weights of each type.
//
// For each variant and type it times the matmuls of a forward pass: prefill
// (n_tok tokens, default 512; the head for the last token only, as
// llama-bench's pp does) and decode (one token, head included). Decode
// streams all 30 layers' weights, so it measures memory as a real decode
// does. Printed: GFLOP/s of the matmuls (2 * rows * K * n_tok per call) and
// the tokens per second that the matmuls alone would allow.
//
// Before that, "shapes" times each matrix shape alone, cache-resident, on
// one thread: the kernels' compute rate at n_tok and at one token.
//
//   bench-cpu-kernels [--variant NAME] [--type NAME] [--threads N]
//                     [--n-tok N] [--layers N] [--reps N] [--mode all|shapes|model]

#include "smol-cpu-kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <time.h>
#include <vector>

using namespace smol::cpu;

namespace {

struct options {
    std::string variant, type, mode = "all";
    int threads = 1;
    int n_tok = 512;
    int layers = 30;
    int reps = 3;
};

const smol_type all_types[] = {SMOL_TYPE_F32,  SMOL_TYPE_F16,  SMOL_TYPE_BF16,
                               SMOL_TYPE_Q8_0, SMOL_TYPE_Q4_0, SMOL_TYPE_Q4_1};

const char * type_name(smol_type t) {
    switch (t) {
    case SMOL_TYPE_F32:
        return "f32";
    case SMOL_TYPE_F16:
        return "f16";
    case SMOL_TYPE_BF16:
        return "bf16";
    case SMOL_TYPE_Q8_0:
        return "q8_0";
    case SMOL_TYPE_Q4_0:
        return "q4_0";
    case SMOL_TYPE_Q4_1:
        return "q4_1";
    }
    return "?";
}

// With one thread the clock is the thread's CPU time, so that other work on
// a shared machine does not count against the kernels (it still evicts
// their caches); with more threads it is the wall clock.
bool use_cpu_clock = true;

double now() {
    if (use_cpu_clock) {
        timespec ts;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// One weight matrix of the model and the input it reads.
struct matrix {
    int64_t rows, K;
    int input; // 0: hidden (576), 1: FFN (1536)
    std::vector<uint8_t> w;
};

// Runs fn(thread index) on n threads, the calling thread being one of them,
// with a busy (yielding) barrier between calls so that small matmuls are not
// dominated by thread start-up or wake-up.
class team {
  public:
    explicit team(int n) : n_(n) {
        for (int i = 1; i < n; i++) workers_.emplace_back([this, i] { loop(i); });
    }
    ~team() {
        stop_ = true;
        generation_.fetch_add(1);
        for (std::thread & t : workers_) t.join();
    }
    void run(const std::function<void(int)> & fn) {
        fn_ = &fn;
        pending_.store(n_ - 1);
        generation_.fetch_add(1);
        fn(0);
        while (pending_.load() != 0) std::this_thread::yield();
    }

  private:
    void loop(int i) {
        unsigned seen = 0;
        for (;;) {
            unsigned g;
            // Yielding: on a machine shared with other work a pure spin can
            // hold the core the other thread needs.
            while ((g = generation_.load()) == seen) std::this_thread::yield();
            seen = g;
            if (stop_) return;
            (*fn_)(i);
            pending_.fetch_sub(1);
        }
    }
    int n_;
    std::vector<std::thread> workers_;
    std::atomic<unsigned> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
    const std::function<void(int)> * fn_ = nullptr;
};

// One matrix of each SmolLM2-135M shape, timed alone over and over: the
// weights stay in cache, so this is the kernels' compute rate.
void bench_shapes(const kernels & k, smol_type t, const options & o) {
    const struct {
        const char * name;
        int64_t rows, K;
    } shapes[] = {{"attn_q", 576, 576},
                  {"ffn_up", 1536, 576},
                  {"ffn_down", 576, 1536},
                  {"head/8", 6144, 576}};
    std::mt19937 rng(4321);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (const auto & s : shapes) {
        std::vector<uint8_t> w(row_bytes(t, s.K) * s.rows);
        std::vector<float> row(s.K);
        for (int64_t r = 0; r < s.rows; r++) {
            for (float & v : row) v = dist(rng);
            k.row_from_f32(t, row.data(), w.data() + r * row_bytes(t, s.K), s.K);
        }
        double gflops[2];
        const int64_t toks[2] = {o.n_tok, 1};
        for (int ti = 0; ti < 2; ti++) {
            const int64_t n_tok = toks[ti];
            std::vector<uint8_t> act(act_bytes(t, s.K) * n_tok);
            for (int64_t j = 0; j < n_tok; j++) {
                for (float & v : row) v = dist(rng);
                k.act_from_f32(t, row.data(), act.data() + j * act_bytes(t, s.K), s.K);
            }
            std::vector<float> y((size_t)(n_tok * s.rows));
            const double flop = 2.0 * s.rows * s.K * n_tok;
            // Many short runs (~20 ms at 50 GFLOP/s), keeping the best: on a
            // shared machine that is the one least disturbed.
            const int calls = (int)std::max(1.0, 1e9 / flop);
            double best = 1e30;
            for (int r = 0; r < 5 * o.reps; r++) {
                const double t0 = now();
                for (int c = 0; c < calls; c++)
                    k.matmul(t, w.data(), row_bytes(t, s.K), s.K, 0, s.rows, act.data(),
                             act_bytes(t, s.K), n_tok, y.data(), s.rows);
                best = std::min(best, (now() - t0) / calls);
            }
            gflops[ti] = flop / best / 1e9;
        }
        std::printf(
            "%-8s %-5s %-9s %5lld x %-5lld  n_tok=%-4d %7.1f GFLOP/s   n_tok=1 %7.1f GFLOP/s\n",
            k.name, type_name(t), s.name, (long long)s.rows, (long long)s.K, o.n_tok, gflops[0],
            gflops[1]);
        std::fflush(stdout);
    }
}

void bench_type(const kernels & k, smol_type t, const options & o, team & pool) {
    const int64_t hidden = 576, ffn = 1536, kv = 192, vocab = 49152;
    std::mt19937 rng(1234);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    auto make = [&](int64_t rows, int64_t K, int input) {
        matrix m{rows, K, input, std::vector<uint8_t>(row_bytes(t, K) * rows)};
        std::vector<float> row(K);
        for (int64_t r = 0; r < rows; r++) {
            for (float & v : row) v = dist(rng);
            k.row_from_f32(t, row.data(), m.w.data() + r * row_bytes(t, K), K);
        }
        return m;
    };
    std::vector<matrix> layers;
    for (int l = 0; l < o.layers; l++) {
        layers.push_back(make(hidden, hidden, 0)); // q
        layers.push_back(make(kv, hidden, 0));     // k
        layers.push_back(make(kv, hidden, 0));     // v
        layers.push_back(make(hidden, hidden, 0)); // o
        layers.push_back(make(ffn, hidden, 0));    // gate
        layers.push_back(make(ffn, hidden, 0));    // up
        layers.push_back(make(hidden, ffn, 1));    // down
    }
    const matrix head = make(vocab, hidden, 0);

    const int64_t n_tok = o.n_tok;
    std::vector<float> x((size_t)(n_tok * ffn));
    for (float & v : x) v = dist(rng);
    std::vector<uint8_t> act[2];
    const int64_t in_K[2] = {hidden, ffn};
    for (int i = 0; i < 2; i++) {
        act[i].resize(act_bytes(t, in_K[i]) * n_tok);
        for (int64_t j = 0; j < n_tok; j++)
            k.act_from_f32(t, x.data() + j * in_K[i], act[i].data() + j * act_bytes(t, in_K[i]),
                           in_K[i]);
    }
    std::vector<float> y((size_t)(n_tok * vocab));

    // Rows split evenly over the threads, as the core does.
    auto matmul = [&](const matrix & m, int64_t tokens) {
        pool.run([&](int ti) {
            const int64_t r0 = m.rows * ti / o.threads, r1 = m.rows * (ti + 1) / o.threads;
            k.matmul(t, m.w.data(), row_bytes(t, m.K), m.K, r0, r1, act[m.input].data(),
                     act_bytes(t, m.K), tokens, y.data(), m.rows);
        });
    };
    auto forward = [&](int64_t tokens, bool head_all) {
        for (const matrix & m : layers) matmul(m, tokens);
        matmul(head, head_all ? tokens : 1);
    };
    double flop_layers = 0.0;
    for (const matrix & m : layers) flop_layers += 2.0 * m.rows * m.K;
    const double flop_head = 2.0 * head.rows * head.K;

    // Prefill: the head runs for one token.
    double best = 1e30;
    for (int r = 0; r < o.reps; r++) {
        const double t0 = now();
        forward(n_tok, false);
        best = std::min(best, now() - t0);
    }
    const double pp_flop = flop_layers * n_tok + flop_head;
    const double pp_gflops = pp_flop / best / 1e9;
    const double pp_tps = n_tok / best * o.layers / 30.0;

    // Decode: one token, head included; weights come from memory.
    double tg_best = 1e30;
    for (int r = 0; r < o.reps * 3; r++) {
        const double t0 = now();
        forward(1, true);
        tg_best = std::min(tg_best, now() - t0);
    }
    const double tg_gflops = (flop_layers + flop_head) / tg_best / 1e9;
    double bytes = (double)head.w.size();
    for (const matrix & m : layers) bytes += (double)m.w.size();
    const double tg_tps = 1.0 / tg_best; // a full model only with --layers 30

    std::printf("%-8s %-5s %7.1f GFLOP/s  pp%-4lld %8.1f tok/s | tg1 %6.1f GFLOP/s %7.1f tok/s "
                "%6.1f GB/s\n",
                k.name, type_name(t), pp_gflops, (long long)n_tok, pp_tps, tg_gflops, tg_tps,
                bytes / tg_best / 1e9);
    std::fflush(stdout);
}

} // namespace

int main(int argc, char ** argv) {
    options o;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--variant")
            o.variant = next();
        else if (a == "--type")
            o.type = next();
        else if (a == "--threads")
            o.threads = std::atoi(next());
        else if (a == "--n-tok")
            o.n_tok = std::atoi(next());
        else if (a == "--layers")
            o.layers = std::atoi(next());
        else if (a == "--mode")
            o.mode = next();
        else if (a == "--reps")
            o.reps = std::atoi(next());
        else {
            std::fprintf(
                stderr,
                "usage: %s [--variant generic|avx2|avx512] [--type f32|f16|bf16|q8_0|q4_0|q4_1]\n"
                "          [--threads N] [--n-tok N] [--layers N] [--reps N]\n"
                "          [--mode all|shapes|model]\n",
                argv[0]);
            return 2;
        }
    }
    o.threads = std::max(1, o.threads);
    o.n_tok = std::max(1, o.n_tok);
    o.layers = std::max(1, o.layers);
    o.reps = std::max(1, o.reps);
    std::printf(
        "SmolLM2-135M matmuls, %d layer(s), %d thread(s), %s time; pp tok/s scaled to 30 layers\n",
        o.layers, o.threads, o.threads == 1 ? "CPU" : "wall");
    use_cpu_clock = o.threads == 1;
    team pool(o.threads);
    for (const char * part : {"shapes", "model"}) {
        if (o.mode != "all" && o.mode != part) continue;
        for (const kernels * k : kernels_available()) {
            if (!o.variant.empty() ? o.variant != k->name : std::string(k->name) == "generic")
                continue;
            for (smol_type t : all_types) {
                if (!o.type.empty() && o.type != type_name(t)) continue;
                if (std::string(part) == "shapes")
                    bench_shapes(*k, t, o);
                else
                    bench_type(*k, t, o, pool);
            }
        }
    }
    return 0;
}
