#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (smol-server, llama.cpp's
llama-server): aggregate generated tokens per second and latency percentiles
(end to end and time to first token) at several concurrency levels. Beside
the rate over the level's wall time (prompts included) it gives two decode
rates: the level's concurrency over the mean time per output token after the
first (TPOT), which counts the other requests' prompts read while a request
generates; and the steady rate, the tokens a second over the intervals when
every client's request is generating and no prompt is being read, which is
what a library's batched decode of that many sequences measures.

Each level sends a bounded number of streamed /v1/completions requests, each
with its own prompt (so no two share more than a few tokens) and a fixed
number of generated tokens (ignore_eos), from that many client threads at
once. Loopback only. One Python process reads a few tens of thousands of
streamed chunks a second at most; for servers faster than that, --processes
spreads each level's clients over that many processes.

    scripts/bench-serve.py --port 8080 [--concurrency 1,4,16,64] [--max-tokens 32]
                           [--requests 8,16,32,64] [--first-request N] [--processes P]
                           [--json out.json]
"""

import argparse
import bisect
import concurrent.futures
import http.client
import json
import sys
import time

TOPICS = ["a lighthouse", "a violin", "the moon", "a bakery", "a glacier", "a robot",
          "a library", "a storm", "a garden", "a train", "a river", "a chess game",
          "a volcano", "a market", "a comet", "a forest"]


def prompt(i):
    return (f"Request {i}. Write a short story about {TOPICS[i % len(TOPICS)]} and "
            f"{TOPICS[(i * 7 + 3) % len(TOPICS)]}, in the style of a fairy tale, for "
            f"reader number {i * 37 % 1000}.")


def one(host, port, model, i, max_tokens):
    """One streamed completion: (latency s, time to first token s, tokens,
    the error the stream ended with or None, the arrival times of its text
    chunks on the monotonic clock)."""
    body = {"model": model, "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, arrivals, usage, err = None, [], None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("error"):
            err = str(ev["error"].get("message", ev["error"]))
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens")
        for ch in ev.get("choices", []):
            if ch.get("text"):
                arrivals.append(time.monotonic())
                if ttft is None:
                    ttft = time.perf_counter() - t0
    c.close()
    return (time.perf_counter() - t0, ttft or 0.0, usage if usage else len(arrivals), err,
            arrivals)


def one_or_error(host, port, model, i, max_tokens):
    """one(), with a broken connection or an HTTP error counted as a failed
    request rather than ending the run."""
    t0 = time.perf_counter()
    try:
        return one(host, port, model, i, max_tokens)
    except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
        return time.perf_counter() - t0, 0.0, 0, f"{type(e).__name__}: {e}", []


def run_share(host, port, model, ids, threads, max_tokens):
    """Requests ids from this many client threads: their one_or_error()s."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda i: one_or_error(host, port, model, i, max_tokens), ids))


def _ready(_):
    return True


def steady_rate(res, level):
    """Text chunks a second while every one of the level's clients has a
    request between its first and its last chunk: the server's decode of
    `level` sequences with no prompt being read beside it, as `--batched`
    measures the library. Counted over the intervals where that holds; 0
    when there are none."""
    spans = [(r[4][0], r[4][-1]) for r in res if not r[3] and len(r[4]) > 1]
    times = sorted(t for r in res if not r[3] for t in r[4])
    edges = sorted({t for s in spans for t in s})
    seconds, chunks = 0.0, 0
    for a, b in zip(edges, edges[1:]):
        if sum(s <= a and b <= e for s, e in spans) == level:
            seconds += b - a
            chunks += bisect.bisect_right(times, b) - bisect.bisect_right(times, a)
    if seconds <= 0:
        return 0.0
    # A chunk is a token but where the detokenizer held text back.
    toks = sum(r[2] for r in res if not r[3] and r[4])
    return chunks / seconds * toks / max(1, len(times))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", default="",
                    help="requests per level (default: max(8, 2 x concurrency), at most 64)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--first-request", type=int, default=0,
                    help="number of the first request (its prompt); runs that should not "
                         "share prompts start apart")
    ap.add_argument("--processes", type=int, default=1,
                    help="client processes each level's requests are spread over (default 1)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.host not in ("127.0.0.1", "localhost", "::1"):
        sys.exit("bench-serve: loopback only")
    levels = [int(x) for x in a.concurrency.split(",")]
    counts = ([int(x) for x in a.requests.split(",")] if a.requests
              else [min(64, max(8, 2 * c)) for c in levels])
    c = http.client.HTTPConnection(a.host, a.port, timeout=30)
    c.request("GET", "/v1/models")
    model = json.loads(c.getresponse().read())["data"][0]["id"]
    c.close()
    one(a.host, a.port, model, 10_000, 4)  # warm up
    procs = None
    if a.processes > 1:
        procs = concurrent.futures.ProcessPoolExecutor(a.processes)
        list(procs.map(_ready, range(a.processes)))  # started before any timing

    print(f"| concurrency | requests | tok/s | decode tok/s | steady tok/s | "
          f"latency p50 / p90 / p99 (s) | TTFT p50 / p90 / p99 (s) |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- |")
    rows = []
    next_id = a.first_request
    for level, n in zip(levels, counts):
        ids = list(range(next_id, next_id + n))
        next_id += n
        t0 = time.perf_counter()
        n_proc = min(a.processes, level)
        if n_proc <= 1:
            res = run_share(a.host, a.port, model, ids, level, a.max_tokens)
        else:
            # Process k takes every n_proc-th request and its share of the
            # level's clients.
            shares = [procs.submit(run_share, a.host, a.port, model, ids[k::n_proc],
                                   level // n_proc + (k < level % n_proc), a.max_tokens)
                      for k in range(n_proc)]
            res = [r for f in shares for r in f.result()]
        wall = time.perf_counter() - t0
        lat, ttft, toks = [r[0] for r in res], [r[1] for r in res], sum(r[2] for r in res)
        tpot = [(r[0] - r[1]) / (r[2] - 1) for r in res if r[2] > 1 and not r[3]]
        decode = level * len(tpot) / sum(tpot) if tpot and sum(tpot) > 0 else 0.0
        steady = steady_rate(res, level)
        errors = [r[3] for r in res if r[3]]
        # Requests that ended with fewer tokens than asked for (ignore_eos):
        # the figures of such a level do not measure what they say.
        short = sum(r[2] < a.max_tokens for r in res)
        row = {"label": a.label, "concurrency": level, "requests": n, "tokens": toks,
               "wall_s": wall, "tok_s": toks / wall, "decode_tok_s": decode,
               "steady_tok_s": steady,
               "tpot_s": [pct(tpot, p) for p in (50, 90, 99)] if tpot else [],
               "latency_s": [pct(lat, p) for p in (50, 90, 99)],
               "ttft_s": [pct(ttft, p) for p in (50, 90, 99)],
               "errors": len(errors), "short": short}
        rows.append(row)
        print(f"| {level} | {n} | {row['tok_s']:.1f} | {decode:.1f} | {steady:.1f} | "
              + " / ".join(f"{x:.2f}" for x in row["latency_s"]) + " | "
              + " / ".join(f"{x:.2f}" for x in row["ttft_s"]) + " |", flush=True)
        if errors or short:
            print(f"  ({short} of {n} requests ended short of {a.max_tokens} tokens, "
                  f"{len(errors)} with an error" + (f": {errors[0]}" if errors else "") + ")",
                  flush=True)
    if procs:
        procs.shutdown()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
