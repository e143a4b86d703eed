#!/usr/bin/env python3
"""smol-server under hostile load and a soak, on loopback, bounded in count
and time, on the real model.

1. Slow clients: 300 connections held open at once, 100 idle, 100 that
   sent half their headers and 100 that sent their headers and a part of
   the body, the last two dripping a byte a second so that no read times
   out. Meanwhile eight honest greedy requests, four at a time, must each
   complete within 1.5 times what the eight took one after another alone
   (plus 5 s), and give the text each gives alone.
2. Clients that hang up mid-stream at random points, beside honest
   requests; afterwards no request is left running or queued.
3. A soak of SOAK seconds (default 150): four clients in a loop of plain,
   streamed and abandoned requests. Every honest answer equals the same
   request alone, and the server's resident memory (VmRSS, sampled every
   2 s) does not grow after the first third of the run.

The server is stopped with SIGTERM and must exit 0 with no sanitizer report.

    tests/test-server-load.py build/examples/smol-server models/SmolLM2-135M-Instruct.Q4_1.gguf \
        [SOAK [--rss-unchecked]]
"""

import concurrent.futures
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time

SERVER, MODEL = sys.argv[1], sys.argv[2]
SOAK = float(sys.argv[3]) if len(sys.argv) > 3 else 150.0
# Under a sanitizer its own bookkeeping (ASan's quarantine, TSan's shadow)
# moves the resident size, which then says nothing of the server's.
RSS_CHECKED = "--rss-unchecked" not in sys.argv
PARALLEL, QUEUE, N_CTX = 4, 16, 2048
failures = []
T0 = time.time()
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:")


def check(cond, what):
    print(f"  {'ok  ' if cond else 'FAIL'} {time.time() - T0:6.1f}s  {what}", flush=True)
    if not cond:
        failures.append(what)


def start_server(log):
    proc = subprocess.Popen(
        [SERVER, "--model", MODEL, "--host", "127.0.0.1", "--port", "0", "--parallel",
         str(PARALLEL), "--max-queue", str(QUEUE), "-c", str(N_CTX), "-t", "2", "--chunk", "64"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        proc.kill()
        sys.exit("test-server-load: FAIL: smol-server did not start: " + line)
    return proc, int(line.rsplit(":", 1)[1])


def stop_server(proc, log):
    proc.terminate()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    log.seek(0)
    text = log.read()
    check(rc == 0, f"smol-server exits 0 on SIGTERM (exit status {rc})")
    found = [line for line in text.splitlines() if any(r in line for r in SANITIZER_REPORTS)]
    check(not found, "smol-server's stderr holds no sanitizer report" +
          (": " + found[0] if found else ""))
    if found or rc != 0:
        print(text[-6000:])


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def body(prompt, stream):
    return json.dumps({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 16, "temperature": 0,
                       "stream": stream, "messages": [{"role": "user", "content": prompt}]})


def ask(port, prompt, stream=False, timeout=120):
    """One greedy chat request; the answer's text."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", body=body(prompt, stream),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    if not stream:
        text = json.loads(r.read())["choices"][0]["message"]["content"]
    else:
        text = ""
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"stream error: {ev}")
            for ch in ev.get("choices", []):
                text += ch.get("delta", {}).get("content") or ""
    c.close()
    return text


def abandon(port, prompt, rng):
    """A streamed request whose client hangs up after a few events."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    b = body(prompt, True).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Content-Type: application/json\r\nContent-Length: " + str(len(b)).encode() +
              b"\r\n\r\n" + b)
    want = rng.randint(0, 6)
    got = b""
    while got.count(b"data: ") < want:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split()
            out[k] = float(v)
    return out


def settled(port, within=60):
    """Waits until no request runs or waits; whether that happened."""
    end = time.time() + within
    while time.time() < end:
        m = metrics(port)
        if m["smol_requests_running"] == 0 and m["smol_requests_queued"] == 0:
            return True
        time.sleep(0.5)
    return False


def slow_clients(port, prompts, alone, bound):
    """Phase 1: 300 slow connections held while honest requests run, each
    within `bound` seconds."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    socks, drips = [], []
    for i in range(300):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 3 == 1:
            s.sendall(head + b"Content-Type: appl")  # headers cut short
            drips.append(s)
        elif i % 3 == 2:
            s.sendall(head + b"Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n"
                      + b'{"model": "x", "mess')  # the body cut short
            drips.append(s)
        socks.append(s)
    stop = threading.Event()

    def drip():
        while not stop.wait(1.0):
            for s in drips:
                try:
                    s.send(b" ")
                except OSError:
                    pass

    dripper = threading.Thread(target=drip)
    dripper.start()
    time.sleep(2)  # past the keep-alive timeout: the idle ones have been seen
    latencies, texts = [], []

    def timed(p):
        t = time.time()
        text = ask(port, p, timeout=bound + 60)
        return time.time() - t, text

    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for lat, text in pool.map(timed, prompts):
                latencies.append(lat)
                texts.append(text)
    except Exception as e:  # a refused or timed-out honest request
        texts.append(f"<{e}>")
    finally:
        stop.set()
        dripper.join()
    closed = 0
    for s in socks:
        try:
            s.setblocking(False)
            closed += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    check(texts == [alone[p] for p in prompts],
          f"{len(prompts)} honest requests beside 300 slow connections give the text each gives "
          "alone")
    check(latencies and max(latencies) < bound,
          f"... each within {bound:.1f} s (the slowest {max(latencies or [0]):.1f} s)")
    print(f"  ({closed} of the 300 slow connections had been closed by the server)")


def disconnects(port, prompts, alone):
    """Phase 2: streams abandoned at random points beside honest requests."""
    rng = random.Random(7)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        gone = [pool.submit(abandon, port, rng.choice(prompts), random.Random(i))
                for i in range(24)]
        honest = [pool.submit(ask, port, p, True) for p in prompts[:4]]
        texts = [f.result() for f in honest]
        for f in gone:
            f.result()
    check(texts == [alone[p] for p in prompts[:4]],
          "honest streams beside 24 abandoned ones give the text each gives alone")
    check(settled(port), "after the hang-ups no request is left running or queued")


def soak(port, pid, prompts, alone):
    """Phase 3: SOAK seconds of mixed traffic, RSS sampled every 2 s."""
    end = time.time() + SOAK
    counts = {"plain": 0, "stream": 0, "abandoned": 0}
    wrong = []
    lock = threading.Lock()

    def client(i):
        rng = random.Random(100 + i)
        while time.time() < end:
            p = rng.choice(prompts)
            mode = rng.choice(["plain", "stream", "stream", "abandoned"])
            if mode == "abandoned":
                abandon(port, p, rng)
            else:
                text = ask(port, p, mode == "stream")
                if text != alone[p]:
                    with lock:
                        wrong.append((p, text))
            with lock:
                counts[mode] += 1

    samples = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(client, i) for i in range(4)]
        while time.time() < end:
            samples.append((time.time() - (end - SOAK), rss_kib(pid)))
            time.sleep(2)
        for f in futs:
            f.result()
    check(not wrong, f"soak: every honest answer equals the same request alone "
                     f"({counts['plain']} plain, {counts['stream']} streamed, "
                     f"{counts['abandoned']} abandoned)")
    warm = [r for t, r in samples if t < SOAK / 3]
    after = [r for t, r in samples if t >= SOAK / 3]
    if not warm or not after:
        check(False, f"soak: too few resident-size samples ({len(samples)}) for a {SOAK} s soak")
        return
    grew = (max(after) - max(warm)) / 1024
    figures = (f"{max(warm) / 1024:.1f} MiB warm-up peak, {max(after) / 1024:.1f} MiB after, "
               f"{len(samples)} samples")
    if RSS_CHECKED:
        check(grew <= 8.0, "soak: resident memory after warm-up stays within 8 MiB of its "
                           f"warm-up peak ({figures})")
    else:
        print(f"  skip          soak: resident memory not checked under a sanitizer ({figures})")
    check(settled(port), "after the soak no request is left running or queued")


def main():
    with tempfile.TemporaryFile("w+") as log:
        proc, port = start_server(log)
        try:
            prompts = [f"Write one short sentence about the number {n}." for n in
                       (2, 7, 19, 31, 64, 128, 500, 1024)]
            t = time.time()
            alone = {p: ask(port, p) for p in prompts}
            t_alone = time.time() - t
            print(f"test-server-load: smol-server on port {port}, pid {proc.pid}; "
                  f"{len(prompts)} answers alone in {t_alone:.1f} s")
            slow_clients(port, prompts, alone, 1.5 * t_alone + 5)
            disconnects(port, prompts, alone)
            soak(port, proc.pid, prompts, alone)
            ok, text = True, ""
            try:
                text = ask(port, prompts[0])
            except Exception as e:
                ok = False
                text = str(e)
            check(ok and text == alone[prompts[0]], "the server still answers as before")
        finally:
            stop_server(proc, log)
    if failures:
        print(f"test-server-load: {len(failures)} FAILED: " + "; ".join(failures))
        sys.exit(1)
    print(f"test-server-load: all passed in {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
