#!/usr/bin/env python3
"""Passkey retrieval (a needle in a haystack) through smol-cli, greedy: a
five-digit pass key stated once at a chosen depth of a long filler text,
asked for at the end; a run counts when the key's digits begin the answer.
Each configuration (the whole cache, or --streaming-heads with a labels
file) runs on the same prompts, so the table compares them line by line.

  scripts/passkey.py --cli build/examples/smol-cli -m MODEL.gguf \\
      --lengths 1024,2048,4096 --depths 0.1,0.5,0.9 --trials 3 \\
      --heads heads.txt [--heads other.txt] [--seed 1]

Lengths are in tokens (about: the filler is counted by smol-cli's prompt);
a configuration's extra arguments go after its file: --heads
'heads.txt --stream-window 512'.
"""

import argparse
import random
import shlex
import subprocess
import sys

FILLER = ("The grass is green. The sky is blue. The sun is yellow. "
          "Here we go. There and back again. ")
# About 25 tokens each with SmolLM2's vocabulary.
FILLER_TOKENS = 25


def prompt(length, depth, key):
    n = max(1, (length - 60) // FILLER_TOKENS)
    at = int(n * depth)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    body = FILLER * at + needle + FILLER * (n - at)
    return ("There is an important piece of information hidden inside a lot of "
            "irrelevant text. Find it and memorize it. " + body +
            "What is the pass key? The pass key is")


def answer(args, extra, text, length):
    cmd = [args.cli, "-m", args.model, "-p", text, "-n", "8", "--temp", "0",
           "--no-display-prompt", "-c", str(length + 256), "-t", str(args.threads)]
    cmd += extra
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"passkey: {' '.join(cmd[:3])} ... failed: {run.stderr.strip()[-400:]}")
    return run.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", default="build/examples/smol-cli")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--heads", action="append", default=[],
                    help="a labels file (and extra flags) to compare with the whole cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    configs = [("whole", [])]
    for h in args.heads:
        words = shlex.split(h)
        configs.append((" ".join(words), ["--streaming-heads"] + words))
    lengths = [int(x) for x in args.lengths.split(",")]
    depths = [float(x) for x in args.depths.split(",")]
    print("| length | depth | " + " | ".join(name for name, _ in configs) + " |")
    print("| ---: | ---: |" + " ---: |" * len(configs))
    totals = [0] * len(configs)
    count = 0
    for length in lengths:
        for depth in depths:
            hits = [0] * len(configs)
            for _ in range(args.trials):
                key = rng.randrange(10000, 100000)
                text = prompt(length, depth, key)
                for i, (_, extra) in enumerate(configs):
                    out = answer(args, extra, text, length)
                    hits[i] += out.strip().startswith(str(key))
                count += 1
            for i in range(len(configs)):
                totals[i] += hits[i]
            print(f"| {length} | {depth:.1f} | " +
                  " | ".join(f"{h}/{args.trials}" for h in hits) + " |", flush=True)
    print("| all | | " + " | ".join(f"{t}/{count}" for t in totals) + " |")


if __name__ == "__main__":
    main()
