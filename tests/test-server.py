#!/usr/bin/env python3
"""smol-server against the official `openai` client, on the real model.

Starts smol-server on a free loopback port and checks: chat, streaming and
completions through the openai client; logprobs in OpenAI's shapes, with
llama-server's values (a recorded fixture); n choices; the Responses API;
embeddings (llama-server's too); /tokenize, /detokenize and
/v1/models/{id}; stop strings, seeds and usage counts;
that concurrent greedy requests give exactly the text each gives alone; that
a shared system prompt hits the prefix cache without changing the output;
that every bad input gets its 4xx/503 JSON error in OpenAI's shape while a
concurrent request completes; and that clients that hang up free their
sequences; that speculation (--lookup, --draft-model) gives the same
greedy text, moves its /metrics counters and refuses bad flags. Then a
server with API keys: 401s, keys from the command line
and a file, and no start beyond loopback without one. Bounded: a few short
requests, loopback only; with --short (under a sanitizer, which runs the
model's kernels instrumented, many times slower) fewer sampled requests
and shorter speculated answers, the same checks.

    tests/test-server.py build/examples/smol-server models/SmolLM2-135M-Instruct.Q4_1.gguf [--short]
"""

import concurrent.futures
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import openai
except ImportError:
    print("test-server: FAIL: the Python package 'openai' is missing; scripts/setup.sh installs "
          "it (python3 -m pip install openai)", file=sys.stderr)
    sys.exit(1)

SERVER, MODEL = sys.argv[1], sys.argv[2]
SHORT = "--short" in sys.argv[3:]
FIXTURES = __file__.rsplit("/", 1)[0] + "/fixtures"
PARALLEL, QUEUE, N_CTX, MAX_BODY = 4, 4, 2048, 65536
from checks import check, failures  # noqa: E402


def start_server(log, extra=()):
    proc = subprocess.Popen(
        [SERVER, "--model", MODEL, "--host", "127.0.0.1", "--port", "0", "--parallel",
         str(PARALLEL), "--max-queue", str(QUEUE), "-c", str(N_CTX), "-t", "2", "--max-body",
         str(MAX_BODY), "--chunk", "64", *extra],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        proc.kill()
        sys.exit("test-server: FAIL: smol-server did not start: " + line)
    return proc, int(line.rsplit(":", 1)[1])


# What a sanitizer build of smol-server prints when it finds a defect (a
# leak at exit, a race, undefined behaviour, a bad access).
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                     "runtime error:")


def stop_server(proc, log):
    """SIGTERM, as an operator stops it: the server must exit 0 within 30 s,
    its stderr free of sanitizer reports."""
    proc.terminate()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    log.seek(0)
    text = log.read()
    check(rc == 0, f"smol-server exits 0 on SIGTERM (exit status {rc})")
    lines = [line for line in text.splitlines() if "engine: request " in line]
    check(lines and all("prompt tokens" in line and "first token" in line and "ms a token" in line
                        for line in lines),
          f"one log line a request ({len(lines)}): {lines[0] if lines else ''}")
    found = [line for line in text.splitlines() if any(r in line for r in SANITIZER_REPORTS)]
    check(not found, "smol-server's stderr holds no sanitizer report" +
          (": " + found[0] if found else ""))
    if found or rc != 0:
        print(text[-6000:])


def raw(port, method, path, body=None, headers=None):
    """One plain HTTP request; returns (status, parsed JSON or text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def metrics(port):
    _, text = raw(port, "GET", "/metrics")
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split()
            out[k] = float(v)
    return out


def is_openai_error(status, body, want_status):
    return (status == want_status and isinstance(body, dict) and "error" in body
            and isinstance(body["error"].get("message"), str) and body["error"]["message"]
            and isinstance(body["error"].get("type"), str)
            and "param" in body["error"] and "code" in body["error"])


def auth():
    """API keys: every route but /health needs one, given on the command
    line or in a file; a server beyond loopback refuses to start without."""
    with tempfile.NamedTemporaryFile("w", suffix=".keys") as keys, \
            tempfile.TemporaryFile("w+") as log:
        keys.write("# keys\n\n  second-key  \n")
        keys.flush()
        proc, port = start_server(log, ["--api-key", "first-key", "--api-key-file", keys.name])
        try:
            check(raw(port, "GET", "/health") == (200, {"status": "ok"}),
                  "/health answers without a key")
            status, body = raw(port, "GET", "/v1/models")
            check(is_openai_error(status, body, 401), f"no key: HTTP {status}")
            status, body = raw(port, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
            check(is_openai_error(status, body, 401), f"a wrong key: HTTP {status}")
            status, body = raw(port, "POST", "/tokenize", b'{"content": "hi"}',
                               headers={"Authorization": "Bearer first-key"})
            check(status == 200, "a key from the command line opens /tokenize")
            keyed = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="second-key",
                                  max_retries=0, timeout=120)
            model = keyed.models.list().data[0].id
            r = keyed.chat.completions.create(model=model, max_tokens=2,
                                              messages=[{"role": "user", "content": "hi"}])
            check(r.usage.completion_tokens > 0, "a key from the file opens chat completions")
            wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="first-ke",
                                  max_retries=0, timeout=120)
            try:
                wrong.models.list()
                check(False, "the openai client raises AuthenticationError for a wrong key")
            except openai.AuthenticationError:
                check(True, "the openai client raises AuthenticationError for a wrong key")
        finally:
            stop_server(proc, log)
    r = subprocess.run([SERVER, "--model", MODEL, "--host", "0.0.0.0", "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "--api-key" in r.stderr,
          f"beyond loopback without a key it does not start: {r.stderr.strip()[:100]!r}")


def speculation(plain_port):
    """--lookup and --draft-model: greedy text as the plain server gives it,
    with the drafted and accepted counters moving; a request's
    'speculative': false; the flags' errors."""
    model = os.path.basename(MODEL).removesuffix(".gguf")
    prompts = ["Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,",
               "The cat sat on the mat. The dog sat on the log. The cat sat on the",
               "Write a short poem about the sea."]

    def choice(port, prompt, **extra):
        status, body = raw(port, "POST", "/v1/completions", json.dumps(
            {"model": model, "prompt": prompt, "max_tokens": 24 if SHORT else 48,
             "temperature": 0, **extra}))
        check(status == 200, f"completion on port {port}: {status}")
        return body["choices"][0] if status == 200 else None

    def complete(port, prompt, **extra):
        c = choice(port, prompt, **extra)
        return c["text"] if c else None

    want = [complete(plain_port, p) for p in prompts]
    # Logprobs come from the target's logits at each position, and a stop
    # string cuts the text where it did: both as without speculation.
    with_lp = dict(logprobs=3, stop=[" The dog sat on the dog"], max_tokens=48)
    want_lp = choice(plain_port, prompts[1], **with_lp)
    for extra in (["--lookup"], ["--draft-model", MODEL, "--draft-max", "4"]):
        with tempfile.TemporaryFile("w+") as log:
            proc, port = start_server(log, extra)
            try:
                m0 = metrics(port)
                with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                    got = list(pool.map(lambda p: complete(port, p), prompts))
                m1 = metrics(port)
                drafted = (m1["smol_spec_drafted_tokens_total"] -
                           m0["smol_spec_drafted_tokens_total"])
                accepted = (m1["smol_spec_accepted_tokens_total"] -
                            m0["smol_spec_accepted_tokens_total"])
                check(got == want, f"{extra[0]}: concurrent greedy completions give the plain "
                      f"server's text ({sum(len(t or '') for t in got)} characters)")
                check(0 < accepted <= drafted,
                      f"{extra[0]}: /metrics counts {drafted:.0f} drafted tokens, {accepted:.0f} "
                      "accepted")
                got_lp = choice(port, prompts[1], **with_lp)
                check(got_lp == want_lp and got_lp["finish_reason"] == "stop",
                      f"{extra[0]}: logprobs and a stop string as the plain server gives them "
                      f"({len(got_lp['logprobs']['tokens'])} tokens)")
                sampled = [complete(port, prompts[2], temperature=0.9, seed=7) for _ in range(2)]
                check(sampled[0] == sampled[1] and sampled[0],
                      f"{extra[0]}: sampling with a seed replays ({sampled[0][:30]!r})")
                m2 = metrics(port)
                off = complete(port, prompts[0], speculative=False)
                m3 = metrics(port)
                check(off == want[0] and m3["smol_spec_drafted_tokens_total"] ==
                      m2["smol_spec_drafted_tokens_total"],
                      f"{extra[0]}: 'speculative': false gives the same text and drafts nothing")
                status, body = raw(port, "POST", "/v1/completions", json.dumps(
                    {"model": model, "prompt": "x", "max_tokens": 2, "speculative": "no"}))
                check(is_openai_error(status, body, 400) and
                      body["error"]["param"] == "speculative",
                      f"{extra[0]}: 'speculative' must be a boolean: {status}")
            finally:
                stop_server(proc, log)

    def refused(extra, flag, words):
        r = subprocess.run([SERVER, "--model", MODEL, "--port", "0", "-c", "256", *extra],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode != 0 and flag in r.stderr and all(w in r.stderr for w in words),
              f"{' '.join(extra)[-40:]!r} is refused naming {flag}: {r.stderr.strip()[:160]!r}")

    refused(["--lookup", "--draft-max", "300"], "--draft-max", ["draft_max 300"])
    refused(["--draft-max", "4"], "--draft-max", ["--lookup"])
    other = MODEL.rsplit("/", 1)[0] + "/gemma-3-270m-q4_k_m.gguf"
    if os.path.exists(other):
        refused(["--draft-model", other], "--draft-model", ["vocabulary", "token"])
    else:
        print(f"  skip: no {other} for the draft of another vocabulary (scripts/fetch-model.sh "
              "gemma3-270m)")


def main():
    with tempfile.TemporaryFile("w+") as log:
        proc, port = start_server(log)
        try:
            run(port)
            speculation(port)
        finally:
            stop_server(proc, log)
    auth()
    if failures:
        print(f"test-server: {len(failures)} FAILED: " + "; ".join(failures))
        sys.exit(1)
    print("test-server: all passed")


def run(port):
    t0 = time.time()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                           max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    print(f"test-server: smol-server on port {port}, model {model}")
    check(model == "SmolLM2-135M-Instruct.Q4_1", "GET /v1/models names the model")
    check(raw(port, "GET", "/health") == (200, {"status": "ok"}), "GET /health")

    # --- a user's control-token text stays text (issue 37) -------------------------
    def prompt_tokens(content):
        r = client.chat.completions.create(model=model, max_tokens=1, temperature=0,
                                           messages=[{"role": "user", "content": content}])
        return r.usage.prompt_tokens
    base, marker = prompt_tokens(""), prompt_tokens("<|im_start|>")
    # As a control token it would be one; as text it is its pieces: < | im _ start | >.
    check(marker == base + 7, f"'<|im_start|>' typed by a user is text: {base} + 7 == {marker}")

    # --- chat, streaming, completions -------------------------------------------
    q = [{"role": "user", "content": "Name three colours."}]
    chat = client.chat.completions.create(model=model, messages=q, max_tokens=24, temperature=0)
    text = chat.choices[0].message.content
    check(bool(text) and chat.choices[0].finish_reason in ("stop", "length"),
          f"chat completion answers: {text!r}")
    check(chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 24 and
          chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens,
          f"usage counts {chat.usage.prompt_tokens}+{chat.usage.completion_tokens}")
    parts, finish, usage = [], None, None
    for ev in client.chat.completions.create(model=model, messages=q, max_tokens=24,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ev.choices:
            parts.append(ev.choices[0].delta.content or "")
            finish = ev.choices[0].finish_reason or finish
        if ev.usage:
            usage = ev.usage
    check("".join(parts) == text and len(parts) > 3, "streamed chat gives the same text in pieces")
    check(finish == chat.choices[0].finish_reason and usage is not None and
          usage.completion_tokens == chat.usage.completion_tokens,
          "streamed chat ends with finish_reason and usage")

    # --- tools and tool calls reach the template (SmolLM2's ignores tools) -------
    call = [{"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    tools = [{"type": "function", "function": {
        "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    answer = client.chat.completions.create(model=model, messages=call, tools=tools, max_tokens=8,
                                            temperature=0)
    check(answer.usage.prompt_tokens > 0, "a chat with tools and a tool call is answered")
    call[1]["tool_calls"][0]["function"]["arguments"] = "{not json"
    try:
        client.chat.completions.create(model=model, messages=call, tools=tools, max_tokens=8)
        check(False, "tool call arguments that are not JSON are refused")
    except openai.BadRequestError as e:
        check("arguments" in str(e), f"tool call arguments that are not JSON are a 400: {e}")

    # tool_choice required or named: the call is enforced with a grammar of
    # the tools' parameters, then read back as tool_calls.
    import jsonschema
    tools2 = [{"type": "function", "function": {
        "name": "weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                             "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"]}}},
        {"type": "function", "function": {"name": "clock", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"]}}}]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools2}
    ask_w = [{"role": "user", "content": "What's the weather in Paris?"}]
    valid, seeds = 0, 3 if SHORT else 6
    for seed in range(seeds):
        r = client.chat.completions.create(model=model, messages=ask_w, tools=tools2,
                                           tool_choice="required", max_tokens=200, temperature=0.8,
                                           seed=seed)
        calls = r.choices[0].message.tool_calls or []
        if r.choices[0].finish_reason == "tool_calls" and len(calls) == 1:
            try:
                jsonschema.validate(json.loads(calls[0].function.arguments),
                                    schemas[calls[0].function.name])
                valid += 1
            except (KeyError, ValueError, jsonschema.ValidationError):
                pass
    check(valid == seeds, f"tool_choice required: {valid} of {seeds} sampled replies are one "
                          "call whose arguments validate against its tool's schema")
    named_call = client.chat.completions.create(
        model=model, messages=ask_w, tools=tools2, max_tokens=64, temperature=0,
        tool_choice={"type": "function", "function": {"name": "clock"}})
    nc = named_call.choices[0].message.tool_calls
    check(nc and nc[0].function.name == "clock" and named_call.choices[0].message.content is None,
          f"a named tool_choice calls that tool: {nc[0].function.arguments if nc else None}")
    deltas = {}
    finish_s = None
    for ev in client.chat.completions.create(
            model=model, messages=ask_w, tools=tools2, max_tokens=64, temperature=0, stream=True,
            tool_choice={"type": "function", "function": {"name": "clock"}}):
        if ev.choices:
            for d in ev.choices[0].delta.tool_calls or []:
                e = deltas.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                e["id"] = d.id or e["id"]
                e["name"] += (d.function.name or "") if d.function else ""
                e["arguments"] += (d.function.arguments or "") if d.function else ""
            finish_s = ev.choices[0].finish_reason or finish_s
    check(list(deltas) == [0] and deltas[0]["name"] == "clock" and
          deltas[0]["arguments"] == nc[0].function.arguments and finish_s == "tool_calls",
          "a streamed tool call arrives as OpenAI streams it: id and name, then argument deltas")
    follow = client.chat.completions.create(
        model=model, max_tokens=12, temperature=0, tools=tools2,
        messages=ask_w + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": nc[0].id, "type": "function",
             "function": {"name": "clock", "arguments": nc[0].function.arguments}}]},
            {"role": "tool", "tool_call_id": nc[0].id, "content": "12:00"}])
    check(follow.choices[0].finish_reason in ("stop", "length", "tool_calls"),
          "the tool's result goes back and is answered")
    resp_call = client.responses.create(
        model=model, input="What's the weather in Lyon?", max_output_tokens=64, temperature=0,
        tool_choice="required",
        tools=[{"type": "function", "name": t["function"]["name"],
                "parameters": t["function"]["parameters"]} for t in tools2])
    fc = [o for o in resp_call.output if o.type == "function_call"]
    check(len(fc) == 1 and fc[0].name in schemas and json.loads(fc[0].arguments) is not None,
          "/v1/responses with tool_choice required gives a function_call item")

    comp = client.completions.create(model=model, prompt="The capital of France is",
                                     max_tokens=12, temperature=0)
    check(comp.choices[0].text.startswith(" Paris"), f"completion: {comp.choices[0].text!r}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=12, temperature=0,
        stream=True) if c.choices)
    check(streamed == comp.choices[0].text, "streamed completion gives the same text")

    # --- logprobs: OpenAI's shapes, and llama-server's values ---------------------
    lp_chat = client.chat.completions.create(model=model, messages=q, max_tokens=12,
                                             temperature=0, logprobs=True, top_logprobs=3)
    entries = lp_chat.choices[0].logprobs.content
    check(b"".join(bytes(e.bytes) for e in entries) ==
          lp_chat.choices[0].message.content.encode(),
          f"chat logprobs: {len(entries)} entries whose bytes are the answer's")
    check(all(len(e.top_logprobs) == 3 and e.top_logprobs[0].logprob == e.logprob and
              e.top_logprobs[0].token == e.token and
              sum(2.718281828459045 ** t.logprob for t in e.top_logprobs) <= 1 + 1e-5
              for e in entries),
          "greedy tokens are their step's most likely; the top 3 sum to at most 1")
    streamed_lp = []
    for ev in client.chat.completions.create(model=model, messages=q, max_tokens=12,
                                             temperature=0, logprobs=True, top_logprobs=3,
                                             stream=True):
        if ev.choices and ev.choices[0].logprobs and ev.choices[0].logprobs.content:
            streamed_lp += [(e.token, e.logprob) for e in ev.choices[0].logprobs.content]
    check(streamed_lp == [(e.token, e.logprob) for e in entries],
          "streamed chat logprobs are the same entries, in order")
    lp_comp = client.completions.create(model=model, prompt="The capital of France is",
                                        max_tokens=12, temperature=0, logprobs=2)
    lp = lp_comp.choices[0].logprobs
    check("".join(lp.tokens) == lp_comp.choices[0].text and lp.text_offset[0] == 0 and
          all(a < b for a, b in zip(lp.text_offset, lp.text_offset[1:])) and
          all(len(t) == 2 for t in lp.top_logprobs),
          "completion logprobs: tokens, text offsets and two alternatives a step")
    # llama-server's values on the same model (tests/fixtures/logprobs.json,
    # scripts/llama-server-fixtures.py logprobs): steps compared while both
    # engines' greedy tokens agree. The engines' logits differ by their rounding (up to
    # about 0.8 on this model's top logits, test-model's check), a logprob
    # by the difference of two such errors, mostly far less: 0.5 nats.
    fixture = json.load(open(FIXTURES + "/logprobs.json"))
    compared, worst = 0, 0.0
    for case in fixture["cases"]:
        _, r = raw(port, "POST", "/v1/completions", json.dumps(
            {"model": model, "prompt": case["prompt"], "max_tokens": len(case["steps"]),
             "temperature": 0, "logprobs": 5}).encode())
        got = r["choices"][0]["logprobs"]
        for i, step in enumerate(case["steps"]):
            _, piece = raw(port, "POST", "/detokenize", json.dumps({"tokens": [step["token"]]}))
            if i >= len(got["tokens"]) or got["tokens"][i] != piece["content"]:
                break
            compared += 1
            worst = max(worst, abs(got["token_logprobs"][i] - step["logprob"]))
            # llama.cpp's alternatives: in smol's top 5 with their values, or
            # (a near tie for the last places) no likelier than smol's fifth.
            top = got["top_logprobs"][i]
            for alt, alt_lp in step["top"]:
                _, alt_piece = raw(port, "POST", "/detokenize", json.dumps({"tokens": [alt]}))
                if alt_piece["content"] in top:
                    worst = max(worst, abs(top[alt_piece["content"]] - alt_lp))
                else:
                    worst = max(worst, alt_lp - min(top.values()))
    check(compared >= 16 and worst <= 0.5,
          f"logprobs within 0.5 of llama-server's over {compared} steps (largest {worst:.3f})")

    # --- n choices: one prompt's KV for all, a seed stream each ----------------------
    story = [{"role": "user", "content": f"Tell me a one-line story about a fox. {time.time()}"}]
    m0 = metrics(port)
    many = client.chat.completions.create(model=model, messages=story, max_tokens=12,
                                          temperature=0.9, seed=77, n=3)
    m1 = metrics(port)
    texts = [ch.message.content for ch in sorted(many.choices, key=lambda ch: ch.index)]
    alone_i = [client.chat.completions.create(model=model, messages=story, max_tokens=12,
                                              temperature=0.9, seed=77 + i) for i in range(3)]
    check(sorted(ch.index for ch in many.choices) == [0, 1, 2] and
          many.usage.completion_tokens == sum(r.usage.completion_tokens for r in alone_i) and
          many.usage.prompt_tokens == alone_i[0].usage.prompt_tokens,
          "n=3 gives choices 0, 1, 2, counts the prompt once and the tokens of all")
    check(texts == [r.choices[0].message.content for r in alone_i],
          "choice i is the answer of seed + i asked alone")
    hits = m1["smol_prefix_cache_hit_tokens_total"] - m0["smol_prefix_cache_hit_tokens_total"]
    check(hits >= 2 * 16, f"choices 1 and 2 take the prompt's KV from choice 0 (+{hits:.0f} hits)")
    phase = 'smol_engine_seconds_total{{phase="{}"}}'.format
    phases = {p: m1[phase(p)] - m0[phase(p)] for p in ("plan", "decode", "draw", "emit")}
    check(phases["decode"] > 0 and all(t >= 0 for t in phases.values()),
          "/metrics times the engine's steps by phase (" +
          ", ".join(f"{p} {1e3 * t:.1f} ms" for p, t in phases.items()) + ")")
    by_index = {}
    for ev in client.chat.completions.create(model=model, messages=story, max_tokens=12,
                                             temperature=0.9, seed=77, n=3, stream=True):
        for ch in ev.choices:
            by_index[ch.index] = by_index.get(ch.index, "") + (ch.delta.content or "")
    check([by_index.get(i) for i in range(3)] == texts, "streamed choices carry their index")

    # --- the Responses API --------------------------------------------------------
    resp = client.responses.create(model=model, input=q[0]["content"], max_output_tokens=24,
                                   temperature=0)
    check(resp.output_text == text and resp.usage.output_tokens == chat.usage.completion_tokens
          and resp.status == ("incomplete" if chat.choices[0].finish_reason == "length"
                              else "completed"),
          f"/v1/responses answers as chat does ({resp.status})")
    kinds, streamed_text, final = [], "", None
    for ev in client.responses.create(model=model, input=q[0]["content"], max_output_tokens=24,
                                      temperature=0, stream=True):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            streamed_text += ev.delta
        if ev.type == "response.completed":
            final = ev.response
    check(kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"] and kinds[-1] == "response.completed" and
          streamed_text == text and final is not None and final.output_text == text,
          f"streamed /v1/responses: {len(kinds)} events, the same text")
    followed = client.responses.create(
        model=model, instructions="Answer briefly.", max_output_tokens=8, temperature=0,
        input=[{"role": "user", "content": "What's the weather in Paris?"},
               {"type": "function_call", "call_id": "c1", "name": "weather",
                "arguments": "{\"city\": \"Paris\"}"},
               {"type": "function_call_output", "call_id": "c1", "output": "21 C"}],
        tools=[{"type": "function", "name": "weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    check(bool(followed.output_text) and followed.usage.input_tokens > resp.usage.input_tokens,
          "/v1/responses takes function calls and their outputs as the conversation")

    # --- embeddings: llama-server's values, both encodings, token ids ------------------
    fx = json.load(open(FIXTURES + "/embeddings.json"))
    emb = client.embeddings.create(model=model, input=fx["inputs"])  # the client asks for base64
    _, as_float = raw(port, "POST", "/v1/embeddings", json.dumps(
        {"model": model, "input": fx["inputs"], "encoding_format": "float"}).encode())
    cos, diff = 1.0, 0.0
    for d, want in zip(emb.data, fx["embeddings"]):
        got = d.embedding
        cos = min(cos, sum(a * b for a, b in zip(got, want)) /
                  (sum(a * a for a in got) * sum(b * b for b in want)) ** 0.5)
        diff = max(diff, max(abs(a - b) for a, b in zip(got, want)))
    check(len(emb.data) == 3 and len(emb.data[0].embedding) == len(fx["embeddings"][0]) and
          cos >= 0.999 and diff <= 0.01,
          f"embeddings match llama-server's (cosine >= {cos:.5f}, largest difference {diff:.4f})")
    check(all(abs(a - b) < 1e-6 for d, f in zip(emb.data, as_float["data"])
              for a, b in zip(d.embedding, f["embedding"])) and
          emb.usage.prompt_tokens == as_float["usage"]["prompt_tokens"],
          "base64 and float encodings carry the same vectors")
    _, ids = raw(port, "POST", "/tokenize", json.dumps({"content": fx["inputs"][0]}))
    by_ids = client.embeddings.create(model=model, input=[ids["tokens"]])
    check(by_ids.data[0].embedding == emb.data[0].embedding,
          "token ids embed as the text they tokenize")

    # --- tokenizer routes and one model's route ------------------------------------
    _, tok = raw(port, "POST", "/tokenize", json.dumps({"content": "Hello world, café",
                                                        "with_pieces": True}))
    ids = [t["id"] for t in tok["tokens"]]
    _, detok = raw(port, "POST", "/detokenize", json.dumps({"tokens": ids}))
    check("".join(t["piece"] for t in tok["tokens"]) == "Hello world, café" and
          detok == {"content": "Hello world, café"},
          f"/tokenize and /detokenize round-trip ({len(ids)} tokens)")
    status, one = raw(port, "GET", "/v1/models/" + model)
    check(status == 200 and one["id"] == model and client.models.retrieve(model).id == model,
          "GET /v1/models/{id}")
    status, none = raw(port, "GET", "/v1/models/gpt-9")
    check(is_openai_error(status, none, 404), "GET /v1/models/{unknown id} is a 404")

    # --- stop strings, seeds -----------------------------------------------------
    cut = client.completions.create(model=model, prompt="The capital of France is",
                                    max_tokens=12, temperature=0, stop=["\n"])
    want = comp.choices[0].text.split("\n")[0]
    check(cut.choices[0].text == want and cut.choices[0].finish_reason == "stop",
          f"stop string cuts the text: {cut.choices[0].text!r}")
    cut_s = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=12, temperature=0,
        stop=["\n"], stream=True) if c.choices)
    check(cut_s == want, "a streamed stop string is held back, not sent")
    a, b = (client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                      temperature=0.9, seed=1234).choices[0].text
            for _ in range(2))
    check(a == b, "the same seed gives the same sampled text")

    # --- batching never changes results ---------------------------------------
    prompts = [f"Write one sentence about the number {n}." for n in (3, 17, 42, 99, 256, 1000)]

    def ask(p):
        r = client.chat.completions.create(model=model, max_tokens=16, temperature=0,
                                           messages=[{"role": "user", "content": p}])
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    check(together == alone, f"{len(prompts)} concurrent greedy requests give the text each "
                             "gives alone")

    # --- prefix cache -----------------------------------------------------------
    system = ("You are Pip, a cheerful assistant for a small bakery in Lyon. You answer in one "
              "short sentence, you never invent prices, and you always mention the croissants. "
              f"Session {time.time()}.")

    def with_system(question):
        return client.chat.completions.create(
            model=model, max_tokens=16, temperature=0,
            messages=[{"role": "system", "content": system},
                      {"role": "user", "content": question}])

    m0 = metrics(port)
    first = with_system("When do you open?")
    other = with_system("Do you sell bread?")
    again = with_system("When do you open?")
    m1 = metrics(port)
    hits = m1["smol_prefix_cache_hit_tokens_total"] - m0["smol_prefix_cache_hit_tokens_total"]
    cached = other.usage.prompt_tokens_details.cached_tokens
    check(cached >= 32 and hits >= cached,
          f"a shared system prompt hits the prefix cache ({cached} of "
          f"{other.usage.prompt_tokens} prompt tokens; /metrics +{hits:.0f})")
    check(again.choices[0].message.content == first.choices[0].message.content,
          "a request served from the cache gives the text it gave computed afresh")
    check(m1["smol_prefix_cache_hit_ratio"] > 0, "/metrics reports the hit ratio")

    # --- bad input while a request runs ----------------------------------------
    good_want = alone[2]
    box = {}
    worker = threading.Thread(target=lambda: box.setdefault("text", ask(prompts[2])))
    worker.start()
    chat_path = "/v1/chat/completions"
    ok_body = {"model": model, "messages": q, "max_tokens": 4}
    cases = [
        ("malformed JSON", chat_path, b'{"model": ', 400),
        ("a body that is not an object", chat_path, b"[1, 2]", 400),
        ("messages of the wrong type", chat_path,
         json.dumps({"model": model, "messages": "hi"}).encode(), 400),
        ("temperature of the wrong type", chat_path,
         json.dumps({**ok_body, "temperature": "hot"}).encode(), 400),
        ("stop of the wrong type", chat_path, json.dumps({**ok_body, "stop": 5}).encode(), 400),
        ("max_tokens of the wrong type", chat_path,
         json.dumps({**ok_body, "max_tokens": "many"}).encode(), 400),
        ("an unknown model", chat_path, json.dumps({**ok_body, "model": "gpt-9"}).encode(), 404),
        ("max_tokens beyond the context", chat_path,
         json.dumps({**ok_body, "max_tokens": N_CTX}).encode(), 400),
        ("a prompt beyond the context", "/v1/completions",
         json.dumps({"model": model, "prompt": "hello " * N_CTX}).encode(), 400),
        ("content with invalid UTF-8", chat_path,
         b'{"model": "' + model.encode() + b'", "max_tokens": 4, '
         b'"messages": [{"role": "user", "content": "caf\xe9 \xff\xfe"}]}', 400),
        ("content with a lone surrogate escape", chat_path,
         b'{"model": "' + model.encode() + b'", "max_tokens": 4, '
         b'"messages": [{"role": "user", "content": "a \\udc80 b"}]}', 400),
        ("a number past a double's range (fuzz-server-request's find)", chat_path,
         b'{"model": "' + model.encode() + b'", "max_tokens": 4, "temperature": 1e999, '
         b'"messages": [{"role": "user", "content": "hi"}]}', 400),
        ("a prompt id past int32, which must not wrap into the vocabulary", "/v1/completions",
         json.dumps({"model": model, "prompt": [1, 2**32 + 5], "max_tokens": 2}).encode(), 400),
        ("a prompt id past uint64", "/v1/completions",
         b'{"model": "' + model.encode() + b'", "prompt": [18446744073709551616]}', 400),
        ("max_tokens past int64", chat_path,
         json.dumps({**ok_body, "max_tokens": 2**64 - 1}).encode(), 400),
        ("a stop string past 256 bytes", chat_path,
         json.dumps({**ok_body, "stop": ["x" * 257]}).encode(), 400),
        ("n of 0", chat_path, json.dumps({**ok_body, "n": 0}).encode(), 400),
        ("n past 16", chat_path, json.dumps({**ok_body, "n": 17}).encode(), 400),
        ("top_logprobs past 20", chat_path,
         json.dumps({**ok_body, "logprobs": True, "top_logprobs": 21}).encode(), 400),
        ("top_logprobs without logprobs", chat_path,
         json.dumps({**ok_body, "top_logprobs": 2}).encode(), 400),
        ("logprobs of the wrong type", chat_path,
         json.dumps({**ok_body, "logprobs": "yes"}).encode(), 400),
        ("completion logprobs below 0", "/v1/completions",
         json.dumps({"model": model, "prompt": "a", "logprobs": -1}).encode(), 400),
        ("more tools than the server takes", chat_path,
         json.dumps({**ok_body, "tools": [{"type": "function", "function": {"name": f"f{i}"}}
                                          for i in range(129)]}).encode(), 400),
        ("/tokenize content that is not a string", "/tokenize", b'{"content": 5}', 400),
        ("tool_choice naming a tool not offered", chat_path,
         json.dumps({**ok_body, "tools": [{"type": "function", "function": {"name": "a"}}],
                     "tool_choice": {"type": "function", "function": {"name": "b"}}}).encode(),
         400),
        ("tool_choice required without tools", chat_path,
         json.dumps({**ok_body, "tool_choice": "required"}).encode(), 400),
        ("tool_choice required beside a grammar", chat_path,
         json.dumps({**ok_body, "tools": [{"type": "function", "function": {"name": "a"}}],
                     "tool_choice": "required", "grammar": "root ::= \"x\""}).encode(), 400),
        ("a stored response named", "/v1/responses",
         json.dumps({"model": model, "input": "hi", "previous_response_id": "r1"}).encode(), 400),
        ("a built-in tool in /v1/responses", "/v1/responses",
         json.dumps({"model": model, "input": "hi", "tools": [{"type": "web_search"}]}).encode(),
         400),
        ("an unknown input item", "/v1/responses",
         json.dumps({"model": model, "input": [{"type": "image", "url": "x"}]}).encode(), 400),
        ("an empty embeddings input", "/v1/embeddings",
         json.dumps({"model": model, "input": ""}).encode(), 400),
        ("more embeddings inputs than the server takes", "/v1/embeddings",
         json.dumps({"model": model, "input": ["a"] * 257}).encode(), 400),
        ("embeddings of other dimensions", "/v1/embeddings",
         json.dumps({"model": model, "input": "a", "dimensions": 8}).encode(), 400),
        ("an unknown embeddings encoding", "/v1/embeddings",
         json.dumps({"model": model, "input": "a", "encoding_format": "int8"}).encode(), 400),
        ("/detokenize of an id past the vocabulary", "/detokenize", b'{"tokens": [99999999]}',
         400),
        ("an oversized body", chat_path, b"{" + b" " * (MAX_BODY + 10) + b"}", 413),
        ("an unknown path", "/v1/nothing", b"{}", 404),
    ]
    for name, path, body, want_status in cases:
        status, reply = raw(port, "POST", path, body)
        check(is_openai_error(status, reply, want_status),
              f"{name}: HTTP {status} {json.dumps(reply)[:90]}")
    try:
        client.chat.completions.create(model="gpt-9", messages=q, max_tokens=4)
        check(False, "the openai client raises NotFoundError for an unknown model")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "the openai client raises NotFoundError for an unknown model")
    worker.join()
    check(box.get("text") == good_want, "the concurrent request completed with its usual text")

    # --- too many requests, and clients that hang up --------------------------
    hogs = []
    for i in range(PARALLEL + QUEUE):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", chat_path, body=json.dumps(
            {"model": model, "stream": True, "max_tokens": 1000, "temperature": 0,
             "messages": [{"role": "user", "content": f"Tell a long story number {i}."}]}),
            headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.fp.readline()  # the first event: the request is in
        hogs.append((c, r))
    status, reply = raw(port, "POST", chat_path, json.dumps(ok_body).encode())
    check(is_openai_error(status, reply, 503), f"beyond every slot and the queue: HTTP {status}")
    deadline = time.time() + 10
    while time.time() < deadline:  # the engine admits them as it steps
        m = metrics(port)
        if m["smol_requests_running"] == PARALLEL:
            break
        time.sleep(0.1)
    check(m["smol_requests_running"] == PARALLEL and m["smol_requests_queued"] == QUEUE,
          f"/metrics: {m['smol_requests_running']:.0f} running, "
          f"{m['smol_requests_queued']:.0f} queued")
    # A non-streaming client that hangs up too.
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"model": model, "max_tokens": 1000,
                       "messages": [{"role": "user", "content": "Count to a thousand."}]})
    for c, r in hogs:
        r.close()
        c.close()
    s.sendall((f"POST {chat_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    time.sleep(1.0)
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        m = metrics(port)
        if m["smol_requests_running"] + m["smol_requests_queued"] == 0:
            break
        time.sleep(0.2)
    check(m["smol_requests_running"] + m["smol_requests_queued"] == 0 and
          m["smol_client_disconnects_total"] >= PARALLEL + QUEUE,
          f"clients that hang up free their sequences "
          f"({m['smol_client_disconnects_total']:.0f} disconnects seen)")
    check(ask(prompts[0]) == alone[0], "the server still answers as before")

    # --- what an operator sees ------------------------------------------------------
    m = metrics(port)
    # The sampled tool_choice replies, then a named, a streamed and a
    # Responses API tool call.
    check(m["smol_constrained_requests_total"] >= seeds + 3 and
          m["smol_tool_calls_total"] >= seeds + 3,
          f"/metrics counts {m['smol_constrained_requests_total']:.0f} constrained requests and "
          f"{m['smol_tool_calls_total']:.0f} tool calls")
    ends = sum(m[f'smol_requests_by_finish_total{{reason="{r}"}}']
               for r in ("stop", "length", "cancelled", "error"))
    check(ends == m["smol_requests_finished_total"] and ends > 30,
          f"/metrics counts {ends:.0f} requests by finish reason")
    for h in ("smol_time_to_first_token_seconds", "smol_time_per_output_token_seconds",
              "smol_queue_wait_seconds"):
        buckets = sorted((float(k.split('"')[1]) if "+Inf" not in k else float("inf"), v)
                         for k, v in m.items() if k.startswith(h + "_bucket"))
        counts = [v for _, v in buckets]
        check(len(buckets) > 5 and counts == sorted(counts) and counts[-1] == m[h + "_count"] > 10
              and m[h + "_sum"] > 0, f"/metrics has the histogram {h} ({counts[-1]:.0f} requests)")
    print(f"test-server: {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
