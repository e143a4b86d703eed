#!/usr/bin/env python3
"""Two smol-server replicas behind nginx, run with
examples/smol-server/nginx-replicas.conf, on the real model.

Starts two replicas (with an API key) on free loopback ports and nginx, as
the current user in the foreground with its prefix, pid, logs and
temporary files in a temporary directory, on a free port. Checks: 24
concurrent chat requests through nginx with the openai client, half of
them streamed, all answered with text; both replicas served some (their
smol_requests_finished_total) and together exactly those; a streamed
answer comes through nginx in pieces while the replica is still
generating; a client that hangs up mid-stream has its request ended early
on the replica; with the config's commented hash on X-Session-Id, the
requests of one session all go to one replica; and a full replica's 503s
are retried on the other. Skips (77) where nginx is missing.

    tests/test-replicas.py build/examples/smol-server models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import concurrent.futures
import getpass
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
if not NGINX:
    print("test-replicas: SKIP: nginx is missing (Debian: apt-get install nginx)")
    sys.exit(77)
try:
    import openai
except ImportError:
    print("test-replicas: FAIL: the Python package 'openai' is missing; scripts/setup.sh installs "
          "it (python3 -m pip install openai)", file=sys.stderr)
    sys.exit(1)

SERVER, MODEL = sys.argv[1], sys.argv[2]
CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "smol-server",
                    "nginx-replicas.conf")
KEY = "replicas-test-key"
N_REQUESTS = 24
MODEL_ID = None  # the replicas' model id, from /v1/models
from checks import check, failures  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(log, slots=("--parallel", "4")):
    proc = subprocess.Popen(
        [SERVER, "--model", MODEL, "--port", "0", "-c", "1024", "-t", "1", "--api-key", KEY,
         *slots], stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        proc.kill()
        sys.exit("test-replicas: FAIL: smol-server did not start: " + line)
    return proc, int(line.rsplit(":", 1)[1])


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics", headers={"Authorization": "Bearer " + KEY})
    text = c.getresponse().read().decode()
    c.close()
    return {k: float(v) for k, v in (line.split() for line in text.splitlines()
                                     if line and not line.startswith("#"))}


def finished(port):
    return metrics(port)["smol_requests_finished_total"]


def nginx_conf(tmp, port, replicas, session_hash):
    """The example with this test's ports (and, when asked, its hash on
    the session header in place of least_conn), in an http block whose
    logs and temporary files are in tmp."""
    with open(CONF) as f:
        site = f.read()
    site, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{port};", site)
    assert n == 1, "the example's listen line has changed"
    servers = re.findall(r"^ *server 127\.0\.0\.1:\d+ .*$", site, re.M)
    assert len(servers) == 2, "the example's upstream servers have changed"
    site = site.replace(servers[0] + "\n", "").replace(servers[1], "\n".join(
        re.sub(r"127\.0\.0\.1:\d+", f"127.0.0.1:{p}", servers[1]) for p in replicas))
    if session_hash:
        site, n = re.subn(r"^( *)least_conn;", r"\1# least_conn;", site, flags=re.M)
        site, m = re.subn(r"^( *)# (hash \$smol_session consistent;)", r"\1\2", site, flags=re.M)
        assert n == 1 and m == 1, "the example's balancing lines have changed"
    with open(os.path.join(tmp, "site.conf"), "w") as f:
        f.write(site)
    user = f"user {getpass.getuser()};\n" if os.geteuid() == 0 else ""
    temps = "\n".join(f"    {k}_temp_path {tmp}/{k};" for k in
                      ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = (f"{user}worker_processes 2;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log;\n"
            f"events {{ worker_connections 256; }}\n"
            f"http {{\n    log_format upstreams '$status $upstream_status $upstream_addr';\n"
            f"    access_log {tmp}/access.log upstreams;\n{temps}\n"
            f"    include {tmp}/site.conf;\n}}\n")
    with open(os.path.join(tmp, "nginx.conf"), "w") as f:
        f.write(conf)


def start_nginx(tmp, replicas, session_hash=False):
    port = free_port()
    nginx_conf(tmp, port, replicas, session_hash)
    proc = subprocess.Popen([NGINX, "-p", tmp, "-c", f"{tmp}/nginx.conf", "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    end = time.time() + 20
    while time.time() < end and proc.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    with open(os.path.join(tmp, "error.log")) as f:
        sys.exit("test-replicas: FAIL: nginx did not start:\n" + f.read()[-3000:])


def stop_nginx(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def ask(client, i):
    """Request i through nginx, streamed when i is odd; returns its text."""
    messages = [{"role": "user", "content": f"Give me {i + 2} words about the number {i}."}]
    if i % 2:
        text, finish = "", None
        for chunk in client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16,
                                                    temperature=0, stream=True):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return text, finish
    r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=16,
                                       temperature=0)
    return r.choices[0].message.content, r.choices[0].finish_reason


def streamed_in_pieces(port, replicas):
    """A streamed answer through nginx: returns the data events, and the
    replicas' generated tokens (this request's) and running requests when
    its first text arrived."""
    before = sum(metrics(p)["smol_tokens_out_total"] for p in replicas)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": MODEL_ID, "stream": True, "max_tokens": 128, "ignore_eos": True, "temperature": 0,
        "messages": [{"role": "user", "content": "Tell me about the sea."}]}),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = c.getresponse()
    events, at_first = [], None
    for line in r:
        if line.startswith(b"data: "):
            events.append(line[6:].strip())
            text = events[-1] != b"[DONE]" and json.loads(events[-1])["choices"]
            if at_first is None and text and text[0]["delta"].get("content"):
                m = [metrics(p) for p in replicas]
                at_first = (sum(x["smol_tokens_out_total"] for x in m) - before,
                            sum(x["smol_requests_running"] for x in m))
    c.close()
    return r.status, events, at_first


def hang_up(port, replicas):
    """A streamed answer through nginx whose client hangs up after a few
    pieces: returns the replicas' client disconnects and generated tokens
    since, once the request has ended (or after 20 s); else its HTTP
    status as the third."""
    before = [metrics(p) for p in replicas]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", body=json.dumps({
        "model": MODEL_ID, "stream": True, "max_tokens": 900, "ignore_eos": True,
        "messages": [{"role": "user", "content": "Tell me a long story."}]}),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = c.getresponse()
    if r.status != 200:
        return None, None, r.status
    for _, line in zip(range(8), r):
        pass
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()

    def since():
        now = [metrics(p) for p in replicas]
        return tuple(sum(n[k] - b[k] for n, b in zip(now, before))
                     for k in ("smol_client_disconnects_total", "smol_requests_finished_total",
                               "smol_tokens_out_total"))
    end = time.time() + 20
    while time.time() < end and since()[1] < 1:  # finished
        time.sleep(0.1)
    return since()


def main():
    global MODEL_ID
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
    replicas = [start_replica(log) for log in logs]
    ports = [p for _, p in replicas]
    tmp = tempfile.mkdtemp(prefix="smol-nginx-")
    nginx = None
    try:
        nginx, port = start_nginx(tmp, ports)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                               max_retries=0, timeout=300)
        MODEL_ID = client.models.list().data[0].id
        check(MODEL_ID == "SmolLM2-135M-Instruct.Q4_1", f"nginx answers /v1/models ({MODEL_ID})")

        before = [finished(p) for p in ports]
        with concurrent.futures.ThreadPoolExecutor(N_REQUESTS) as pool:
            futures = [pool.submit(ask, client, i) for i in range(N_REQUESTS)]
            results = []
            for f in futures:
                try:
                    results.append(f.result())
                except Exception as e:  # noqa: BLE001 - a lost request is the finding
                    results.append((None, repr(e)))
        good = [r for r in results if r[0] and r[1] in ("stop", "length")]
        check(len(good) == N_REQUESTS, f"{N_REQUESTS} concurrent requests through nginx, half "
              f"streamed: {len(good)} answered with text" +
              ("" if len(good) == N_REQUESTS else f" ({[r for r in results if r not in good][:3]})"))
        served = [finished(p) - b for p, b in zip(ports, before)]
        check(all(n > 0 for n in served) and sum(served) == N_REQUESTS,
              f"both replicas served requests, {N_REQUESTS} in all ({served})")

        status, events, at_first = streamed_in_pieces(port, ports)
        check(status == 200 and events[-1] == b"[DONE]" and len(events) > 64,
              f"a streamed answer through nginx: {len(events)} data events, ending in [DONE]")
        check(at_first and at_first[0] < 64,
              "its first text arrived before the replica had generated half the answer "
              f"({at_first and at_first[0]:.0f} of 128 tokens)")
        gone, ended, tokens = hang_up(port, ports)
        check(gone == 1 and ended == 1 and tokens < 900,
              "a client that hangs up mid-stream: the replica ends its request early "
              f"(disconnects {gone}, finished {ended}, tokens {tokens} of 900; HTTP 200 first)")
        stop_nginx(nginx)
        nginx = None

        # The commented alternative: one session, one replica.
        nginx, port = start_nginx(tmp, ports, session_hash=True)
        for session in ("alpha", "beta", "gamma"):
            at = [finished(p) for p in ports]
            sess = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                                 max_retries=0, timeout=300,
                                 default_headers={"X-Session-Id": session})
            for turn in range(3):
                sess.chat.completions.create(model=MODEL_ID, max_tokens=4, messages=[
                    {"role": "user", "content": f"Turn {turn} of {session}."}])
            went = [finished(p) - a for p, a in zip(ports, at)]
            check(sorted(went) == [0, 3], f"hash on X-Session-Id: session {session}'s three "
                  f"requests all went to one replica ({went})")
        anon = [finished(p) for p in ports]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                               max_retries=0, timeout=300)
        for i in range(12):
            client.chat.completions.create(model=MODEL_ID, max_tokens=2, messages=[
                {"role": "user", "content": f"Hello {i}."}])
        went = [finished(p) - a for p, a in zip(ports, anon)]
        check(all(n > 0 for n in went), f"requests without a session spread over both ({went})")
        stop_nginx(nginx)
        nginx = None

        # A full replica (one slot, one place in its queue, no wait) answers
        # 503 to the rest; nginx hands those to the other replica.
        logs.append(tempfile.TemporaryFile("w+"))
        full = start_replica(logs[-1], ("--parallel", "1", "--max-queue", "1", "--queue-wait", "0"))
        replicas.append(full)
        os.remove(os.path.join(tmp, "access.log"))
        nginx, port = start_nginx(tmp, [full[1], ports[1]])
        at = [finished(p) for p in (full[1], ports[1])]

        def long(i):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            c.request("POST", "/v1/chat/completions", body=json.dumps({
                "model": MODEL_ID, "max_tokens": 32, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Count to {i + 10}."}]}),
                headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
            r = c.getresponse()
            r.read()
            c.close()
            return r.status

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(long, range(16)))
        went = [finished(p) - a for p, a in zip((full[1], ports[1]), at)]
        with open(os.path.join(tmp, "access.log")) as f:
            lines = f.read().splitlines()
        retried = sum(1 for line in lines if line.startswith("200 503, "))
        if statuses != [200] * 16:
            print("    nginx's log (status, upstream statuses):", sorted(set(lines)))
        check(statuses == [200] * 16 and retried > 0 and went[0] > 0 and sum(went) == 16,
              f"a full replica's 503s are retried on the other: {statuses.count(200)} of 16 "
              f"answered, {retried} after a 503, served {went}")
    finally:
        if nginx:
            stop_nginx(nginx)
        for proc, _ in replicas:
            proc.terminate()
        for (proc, _), log in zip(replicas, logs):
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = None
            check(rc == 0, f"a replica exits 0 on SIGTERM ({rc})")
        if failures:
            for log in logs:
                log.seek(0)
                print(log.read()[-2000:])
            path = os.path.join(tmp, "error.log")
            if os.path.exists(path):
                with open(path) as f:
                    print(f.read()[-3000:])
        shutil.rmtree(tmp, ignore_errors=True)

    if failures:
        print(f"test-replicas: FAIL: {len(failures)} check(s) failed")
        sys.exit(1)
    print("test-replicas: OK")


main()
