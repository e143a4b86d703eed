#!/usr/bin/env python3
"""Records llama-server's answers on the real model as fixtures for
tests/test-server.py, talking to it on loopback only:

  logprobs    greedy completions of a few prompts: each generated token's
              log-probability and the five most likely tokens at each step
              (tests/fixtures/logprobs.json)
  embeddings  mean pooling over each input's tokens, scaled to length 1, as
              llama-server --embedding --pooling mean gives them
              (tests/fixtures/embeddings.json)

    scripts/llama-server-fixtures.py logprobs|embeddings \\
        [--llama-bin /work/peers/build-cpu/bin] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

llama-server comes from scripts/peers.sh.
"""

import argparse
import json
import socket
import subprocess
import time
import urllib.request

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Water boils at a temperature of", "Once upon a time, in a small village,"]
INPUTS = ["The capital of France is Paris.", "def fibonacci(n): return n if n < 2 else "
          "fibonacci(n - 1) + fibonacci(n - 2)", "Small language models run on laptops."]


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def logprobs(url, a):
    cases = []
    for p in PROMPTS:
        reply = post(url, "/v1/completions",
                     {"prompt": p, "max_tokens": 8, "temperature": 0, "logprobs": 5})
        steps = [{"token": c["id"], "logprob": c["logprob"],
                  "top": [[t["id"], t["logprob"]] for t in c["top_logprobs"]]}
                 for c in reply["choices"][0]["logprobs"]["content"]]
        cases.append({"prompt": p, "steps": steps})
    version = subprocess.run([f"{a.llama_bin}/llama-server", "--version"],
                             capture_output=True, text=True)
    return {"what": "llama-server's greedy completions with logprobs 5 "
                    "(scripts/llama-server-fixtures.py logprobs)",
            "llama": (version.stdout + version.stderr).strip().splitlines()[0:2],
            "model": a.model.split("/")[-1], "cases": cases}


def embeddings(url, a):
    reply = post(url, "/v1/embeddings", {"input": INPUTS})
    vectors = [[round(x, 6) for x in d["embedding"]]
               for d in sorted(reply["data"], key=lambda d: d["index"])]
    return {"what": "llama-server --embedding --pooling mean "
                    "(scripts/llama-server-fixtures.py embeddings)",
            "model": a.model.split("/")[-1], "inputs": INPUTS, "embeddings": vectors}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["logprobs", "embeddings"])
    ap.add_argument("--llama-bin", default="/work/peers/build-cpu/bin")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--embedding", "--pooling", "mean"] if a.kind == "embeddings" else []
    proc = subprocess.Popen([f"{a.llama_bin}/llama-server", "-m", a.model, "--port", str(port),
                             "-t", "2", "-c", "1024", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/health").status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        out = (logprobs if a.kind == "logprobs" else embeddings)(url, a)
        path = f"tests/fixtures/{a.kind}.json"
        with open(path, "w") as f:
            json.dump(out, f, indent=1 if a.kind == "logprobs" else None)
            f.write("\n")
        print(f"wrote {path}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
