#!/usr/bin/env python3
"""Streaming heads end to end on the real model: smol-heads labels the
heads on facts hidden in Python's documentation text (read at run time),
and smol-cli answers a pass-key question (scripts/passkey.py's prompt) the
way the whole cache does with half the heads streaming by those labels,
while the same number of streaming heads taken from the other end of the
ranking loses the key: the labels carry what retrieval needs. Then the
labels file's checks: another model's shape, a damaged file, flags
without a file, each refused with the fix; --dump-plan shows each layer's
heads.

    tests/test-heads.py BUILD_DIR MODEL.gguf
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
from passkey import prompt  # noqa: E402
from pydoc_data.topics import topics  # noqa: E402

SINK, WINDOW = 8, 32


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"test-heads: FAIL: {' '.join(cmd[:2])} ... exited {p.returncode}: "
                 f"{p.stderr.strip()[-600:]}")
    return p


def labels(path):
    lines = open(path).read().splitlines()
    assert lines[0] == "smol-heads 1", lines[0]
    assert lines[1] == "layers 30 kv-heads 3", lines[1]
    assert lines[2] == f"sink {SINK} window {WINDOW}", lines[2]
    flags, scores = [], []
    for layer, line in enumerate(lines[3:]):
        head, _, rest = line.partition("#")
        at, row = head.split()
        assert int(at) == layer and len(row) == 3 and set(row) <= {"S", "-"}, line
        flags += [c == "S" for c in row]
        scores += [float(x) for x in rest.split()]
    assert len(flags) == 90 and len(scores) == 90
    return lines[:3], flags, scores


def write(path, header, flags):
    with open(path, "w") as f:
        f.write("\n".join(header) + "\n")
        for layer in range(30):
            f.write(f"{layer} " + "".join("S" if flags[3 * layer + k] else "-"
                                          for k in range(3)) + "\n")


def main():
    build, model = sys.argv[1], sys.argv[2]
    heads_bin = os.path.join(build, "examples", "smol-heads")
    cli = os.path.join(build, "examples", "smol-cli")
    tmp = tempfile.mkdtemp(prefix="smol-heads-")
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:  # the documentation's second half: not the pass-key filler
        body = "\n\n".join(topics[k].strip() for k in sorted(topics))
        f.write(body[len(body) // 2:])
    best = os.path.join(tmp, "best.txt")
    run([heads_bin, "-m", model, "-f", text, "-o", best, "-c", "384", "--sink", str(SINK),
         "--window", str(WINDOW), "--needles", "3", "-t", "2"])
    header, flags, scores = labels(best)
    assert sum(flags) == 45, sum(flags)
    # The streaming heads are the 45 of lowest score.
    cut = sorted(scores)[44]
    assert all(s <= cut for s, f in zip(scores, flags) if f)
    assert all(s >= cut for s, f in zip(scores, flags) if not f)
    worst = os.path.join(tmp, "worst.txt")
    order = sorted(range(90), key=lambda i: -scores[i])
    write(worst, header, [i in set(order[:45]) for i in range(90)])

    def answers(extra, key, text):
        out = run([cli, "-m", model, "-p", text, "-n", "8", "--temp", "0",
                   "--no-display-prompt", "-c", "1024", "-t", "2"] + extra).stdout
        return out.strip().startswith(str(key))

    keys = [48213, 90517, 27364]
    got = {"whole": 0, "best": 0, "worst": 0}
    for i, key in enumerate(keys):
        p = prompt(480, 0.1 + 0.2 * i, key)
        got["whole"] += answers([], key, p)
        got["best"] += answers(["--streaming-heads", best], key, p)
        got["worst"] += answers(["--streaming-heads", worst], key, p)
    print(f"test-heads: pass keys found of {len(keys)}: {got}")
    assert got["whole"] == len(keys), got
    assert got["best"] == len(keys), got
    assert got["worst"] < len(keys), got

    # The plan shows each layer's heads.
    plan = run([cli, "-m", model, "-p", "x", "-n", "1", "--dump-plan", "-t", "2",
                "--streaming-heads", best]).stderr
    assert "streaming heads (S; approximate: the first 8 positions and the last 32)" in plan, plan

    # Refusals, each naming the fix.
    def refused(extra, says):
        p = run([cli, "-m", model, "-p", "x", "-n", "1", "-t", "2"] + extra, ok=False)
        assert p.returncode != 0 and says in p.stderr, (extra, p.returncode, p.stderr)

    other = os.path.join(tmp, "other.txt")
    with open(other, "w") as f:
        f.write("smol-heads 1\nlayers 2 kv-heads 3\nsink 4 window 16\n0 S--\n1 ---\n")
    refused(["--streaming-heads", other], "label this model with smol-heads")
    damaged = os.path.join(tmp, "damaged.txt")
    with open(damaged, "w") as f:
        f.write("\n".join(header) + "\n0 SX-\n")
    refused(["--streaming-heads", damaged], "S or -")
    with open(damaged, "w") as f:
        f.write("\n".join(header) + "\n" + "0 S--\n" * 3)
    refused(["--streaming-heads", damaged], "line 5 is not layer 1")
    refused(["--streaming-heads", os.path.join(tmp, "absent.txt")], "cannot read")
    refused(["--stream-window", "64"], "need --streaming-heads FILE")
    print("test-heads: OK")


if __name__ == "__main__":
    main()
