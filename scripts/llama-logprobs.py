#!/usr/bin/env python3
"""Records llama-server's logprobs on the real model as a fixture for
tests/test-server.py: greedy completions of a few prompts, each generated
token's log-probability and the five most likely tokens at each step.

    scripts/llama-logprobs.py [--llama-bin /work/peers/build-cpu/bin] \\
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out tests/fixtures/logprobs.json]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default="/work/peers/build-cpu/bin")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/fixtures/logprobs.json")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([f"{a.llama_bin}/llama-server", "-m", a.model, "--port", str(port),
                             "-t", "2", "-c", "1024"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/health").status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        cases = []
        for p in PROMPTS:
            body = json.dumps({"prompt": p, "max_tokens": 8, "temperature": 0,
                               "logprobs": 5}).encode()
            req = urllib.request.Request(url + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
            reply = json.load(urllib.request.urlopen(req))
            steps = [{"token": c["id"], "logprob": c["logprob"],
                      "top": [[t["id"], t["logprob"]] for t in c["top_logprobs"]]}
                     for c in reply["choices"][0]["logprobs"]["content"]]
            cases.append({"prompt": p, "steps": steps})
        version = subprocess.run([f"{a.llama_bin}/llama-server", "--version"],
                                 capture_output=True, text=True)
        out = {"what": "llama-server's greedy completions with logprobs 5 (scripts/llama-logprobs.py)",
               "llama": (version.stdout + version.stderr).strip().splitlines()[0:2],
               "model": a.model.split("/")[-1], "cases": cases}
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
        print(f"wrote {a.out}: {len(cases)} prompts")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
