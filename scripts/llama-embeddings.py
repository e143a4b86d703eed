#!/usr/bin/env python3
"""Records llama-server's embeddings of the real model as a fixture for
tests/test-server.py: mean pooling over each input's tokens, scaled to
length 1, as llama-server --embedding --pooling mean gives them.

    scripts/llama-embeddings.py [--llama-bin /work/peers/build-cpu/bin] \\
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--out tests/fixtures/embeddings.json]

llama-server comes from scripts/peers.sh.
"""

import argparse
import json
import socket
import subprocess
import time
import urllib.request

INPUTS = ["The capital of France is Paris.", "def fibonacci(n): return n if n < 2 else "
          "fibonacci(n - 1) + fibonacci(n - 2)", "Small language models run on laptops."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default="/work/peers/build-cpu/bin")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/fixtures/embeddings.json")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([f"{a.llama_bin}/llama-server", "-m", a.model, "--port", str(port),
                             "-t", "2", "-c", "1024", "--embedding", "--pooling", "mean"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/health").status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        req = urllib.request.Request(url + "/v1/embeddings", json.dumps({"input": INPUTS}).encode(),
                                     {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(req))
        vectors = [[round(x, 6) for x in d["embedding"]]
                   for d in sorted(reply["data"], key=lambda d: d["index"])]
        out = {"what": "llama-server --embedding --pooling mean (scripts/llama-embeddings.py)",
               "model": a.model.split("/")[-1], "inputs": INPUTS, "embeddings": vectors}
        with open(a.out, "w") as f:
            json.dump(out, f)
            f.write("\n")
        print(f"wrote {a.out}: {len(vectors)} vectors of {len(vectors[0])}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
