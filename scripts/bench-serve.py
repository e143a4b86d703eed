#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (smol-server, llama.cpp's
llama-server): aggregate generated tokens per second and latency percentiles
(end to end and time to first token) at several concurrency levels.

Each level sends a bounded number of streamed /v1/completions requests, each
with its own prompt (so no two share more than a few tokens) and a fixed
number of generated tokens (ignore_eos), from that many client threads at
once. Loopback only.

    scripts/bench-serve.py --port 8080 [--concurrency 1,4,16,64] [--max-tokens 32]
                           [--requests 8,16,32,64] [--first-request N] [--json out.json]
"""

import argparse
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
    the error the stream ended with or None)."""
    body = {"model": model, "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, chunks, usage, err = None, 0, None, None
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
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    c.close()
    return time.perf_counter() - t0, ttft or 0.0, usage if usage else chunks, err


def one_or_error(host, port, model, i, max_tokens):
    """one(), with a broken connection or an HTTP error counted as a failed
    request rather than ending the run."""
    t0 = time.perf_counter()
    try:
        return one(host, port, model, i, max_tokens)
    except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
        return time.perf_counter() - t0, 0.0, 0, f"{type(e).__name__}: {e}"


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

    print(f"| concurrency | requests | tok/s | latency p50 / p90 / p99 (s) | "
          f"TTFT p50 / p90 / p99 (s) |")
    print("| ---: | ---: | ---: | --- | --- |")
    rows = []
    next_id = a.first_request
    for level, n in zip(levels, counts):
        ids = list(range(next_id, next_id + n))
        next_id += n
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(level) as pool:
            res = list(pool.map(lambda i: one_or_error(a.host, a.port, model, i, a.max_tokens),
                                ids))
        wall = time.perf_counter() - t0
        lat, ttft, toks = [r[0] for r in res], [r[1] for r in res], sum(r[2] for r in res)
        errors = [r[3] for r in res if r[3]]
        # Requests that ended with fewer tokens than asked for (ignore_eos):
        # the figures of such a level do not measure what they say.
        short = sum(r[2] < a.max_tokens for r in res)
        row = {"label": a.label, "concurrency": level, "requests": n, "tokens": toks,
               "wall_s": wall, "tok_s": toks / wall,
               "latency_s": [pct(lat, p) for p in (50, 90, 99)],
               "ttft_s": [pct(ttft, p) for p in (50, 90, 99)],
               "errors": len(errors), "short": short}
        rows.append(row)
        print(f"| {level} | {n} | {row['tok_s']:.1f} | "
              + " / ".join(f"{x:.2f}" for x in row["latency_s"]) + " | "
              + " / ".join(f"{x:.2f}" for x in row["ttft_s"]) + " |", flush=True)
        if errors or short:
            print(f"  ({short} of {n} requests ended short of {a.max_tokens} tokens, "
                  f"{len(errors)} with an error" + (f": {errors[0]}" if errors else "") + ")",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
