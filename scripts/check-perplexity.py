#!/usr/bin/env python3
"""Perplexity of smol against llama.cpp's llama-perplexity, on the same files
and the same real text (pydoc_data.topics, scripts/pydoc-text.py): 16 chunks
of 512 tokens, the second half of each scored, as llama-perplexity does.

Two uses:

  * Compare and record (where llama.cpp is built, scripts/peers.sh):
        scripts/check-perplexity.py compare --llama-bin /work/peers/build-cpu/bin \\
            [--write-fixture tests/fixtures/perplexity.json]
    requantizes the real SmolLM2-135M Q4_1 with llama-quantize and with
    smol-quantize to each type (Q4_K_M, Q5_K_M, Q6_K), runs smol-perplexity
    and llama-perplexity on every file (llama.cpp's and smol's), prints the
    table of BENCHMARKS.md and fails when any pair is more than 1% apart.
    The fixture keeps llama.cpp's values on its own files, with the text's
    hash.

  * Test (ctest, no llama.cpp needed):
        scripts/check-perplexity.py test --fixture tests/fixtures/perplexity.json
    rebuilds each file with smol-quantize (byte for byte llama-quantize's,
    which test-requant shows), runs smol-perplexity on it and fails when it
    is more than 1% from the recorded llama.cpp value. Gemma 3 270M's Q4_K_M
    file (scripts/fetch-model.sh gemma3-270m), a second family, is held to
    its recorded value the same way. When this machine's
    Python ships other documentation topics (another version), the text
    differs and the test reports a skip (exit 77).

  * The KV cache's type (--kv-type f16, q8_0, q4_0), against llama.cpp's
    -ctk/-ctv (with -fa on, which its quantized V needs) on the same text:
        scripts/check-perplexity.py kv --llama-bin /work/peers/build-cpu/bin
    prints the table of BENCHMARKS.md (16 chunks), llama.cpp also with its
    K/V rotation off (LLAMA_ATTN_ROT_DISABLE=1). And as a test (ctest,
    seconds, any Python's topics):
        scripts/check-perplexity.py kv-test
    fails when q8_0 KV is more than 0.5% from f16 KV over 2 chunks, or
    q4_0 KV more than 15%.

Common options: --model (the Q4_1 file), --build (smol's build folder).
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K"]
CHUNKS = 16
CTX = 512
THREADS = 2
TOLERANCE = 0.01
SKIP = 77



def write_text(path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "pydoc-text.py"), path],
                         check=True, capture_output=True, text=True).stdout
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest(), out.strip()


def final_estimate(output, who):
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", output)
    if not m:
        raise SystemExit(f"{who} printed no final estimate:\n{output[-2000:]}")
    return float(m.group(1)), float(m.group(2))


def smol_ppl(build, model, text, extra=(), chunks=CHUNKS):
    cmd = [os.path.join(build, "examples", "smol-perplexity"), "-m", model, "-f", text,
           "-c", str(CTX), "-b", str(CTX), "--chunks", str(chunks), "-t", str(THREADS),
           *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return final_estimate(r.stdout + r.stderr, "smol-perplexity")


def llama_ppl(bin_dir, model, text, extra=(), env=None):
    cmd = [os.path.join(bin_dir, "llama-perplexity"), "-m", model, "-f", text, "-c", str(CTX),
           "-b", str(CTX), "--chunks", str(CHUNKS), "-t", str(THREADS), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env=None if env is None else {**os.environ, **env})
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return final_estimate(r.stdout + r.stderr, "llama-perplexity")


def smol_quantize(build, model, out, file_type):
    cmd = [os.path.join(build, "examples", "smol-quantize"), model, out, file_type,
           "-t", str(THREADS)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def bits_per_weight(path):
    """File bits over the weights' element count (as llama.cpp reports bpw)."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    n = sum(int(t.n_elements) for t in r.tensors)
    b = sum(int(t.n_bytes) for t in r.tensors)
    return 8.0 * b / n


def rel(a, b):
    return abs(a - b) / b


def compare(args):
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "pydoc.txt")
        sha, about = write_text(text)
        print(about)
        rows, fixture, worst = [], {}, 0.0
        files = [("Q4_1", args.model, None)]
        for t in TYPES:
            theirs = os.path.join(tmp, f"llama-{t}.gguf")
            ours = os.path.join(tmp, f"smol-{t}.gguf")
            subprocess.run([os.path.join(args.llama_bin, "llama-quantize"), "--allow-requantize",
                            args.model, theirs, t, str(THREADS)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            smol_quantize(args.build, args.model, ours, t)
            files.append((t, theirs, ours))
        for t, theirs, ours in files:
            s, s_err = smol_ppl(args.build, theirs, text)
            l, l_err = llama_ppl(args.llama_bin, theirs, text)
            row = {"type": t, "bpw": bits_per_weight(theirs),
                   "mib": os.path.getsize(theirs) / 2**20, "smol": s, "smol_err": s_err,
                   "llama": l, "llama_err": l_err}
            worst = max(worst, rel(s, l))
            if ours:
                row["llama_on_smol_file"] = llama_ppl(args.llama_bin, ours, text)[0]
                worst = max(worst, rel(row["llama_on_smol_file"], l))
            rows.append(row)
            fixture[t] = l
            print(f"{t}: smol {s:.4f}, llama.cpp {l:.4f} ({100 * (s - l) / l:+.2f}%)"
                  + (f"; llama.cpp on smol-quantize's file {row['llama_on_smol_file']:.4f}"
                     if ours else ""), flush=True)
        gemma = None
        if os.path.exists(args.gemma):
            s, s_err = smol_ppl(args.build, args.gemma, text)
            l, l_err = llama_ppl(args.llama_bin, args.gemma, text)
            gemma = {"file": os.path.basename(args.gemma), "llama": l}
            worst = max(worst, rel(s, l))
            rows.append({"type": "Gemma 3 270M Q4_K_M", "bpw": bits_per_weight(args.gemma),
                         "mib": os.path.getsize(args.gemma) / 2**20, "smol": s,
                         "smol_err": s_err, "llama": l, "llama_err": l_err})
            print(f"Gemma 3 270M: smol {s:.4f}, llama.cpp {l:.4f} ({100 * (s - l) / l:+.2f}%)",
                  flush=True)
        print()
        print("| type | bits/weight | file MiB | smol PPL | llama.cpp PPL | smol vs llama.cpp "
              "| llama.cpp on smol-quantize's file |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            on_smol = f"{r['llama_on_smol_file']:.4f}" if "llama_on_smol_file" in r else "-"
            print(f"| {r['type']} | {r['bpw']:.2f} | {r['mib']:.2f} | {r['smol']:.4f} ± "
                  f"{r['smol_err']:.4f} | {r['llama']:.4f} ± {r['llama_err']:.4f} | "
                  f"{100 * (r['smol'] - r['llama']) / r['llama']:+.2f}% | {on_smol} |")
        if args.write_fixture:
            with open(args.write_fixture, "w") as f:
                json.dump({"text_sha256": sha, "text": about, "chunks": CHUNKS, "ctx": CTX,
                           "engine": "llama-perplexity, llama.cpp 0c1e57098",
                           "source": os.path.basename(args.model),
                           "notes": ["llama: llama-perplexity's final estimate on the model "
                                     "(Q4_1) and on llama-quantize --allow-requantize's file "
                                     "of each type"],
                           "llama": fixture, "gemma3": gemma}, f, indent=1)
                f.write("\n")
            print(f"wrote {args.write_fixture}")
        print(f"largest difference: {100 * worst:.2f}% (allowed {100 * TOLERANCE:.0f}%)")
        return 0 if worst <= TOLERANCE else 1


def test(args):
    with open(args.fixture) as f:
        fx = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "pydoc.txt")
        sha, about = write_text(text)
        if sha != fx["text_sha256"]:
            print(f"skipped: {about}; the fixture was made from another text "
                  f"({fx['text']}), so its values do not apply here")
            return SKIP
        if not os.path.exists(args.model):
            print(f"{args.model} is missing: run scripts/fetch-model.sh")
            return 1
        failed = 0
        for t, want in fx["llama"].items():
            path = args.model
            if t != "Q4_1":
                path = os.path.join(tmp, f"{t}.gguf")
                smol_quantize(args.build, args.model, path, t)
            got, err = smol_ppl(args.build, path, text)
            ok = rel(got, want) <= TOLERANCE
            failed += not ok
            print(f"{t}: smol {got:.4f} ± {err:.4f}, llama.cpp {want:.4f} "
                  f"({100 * (got - want) / want:+.2f}%, allowed ±{100 * TOLERANCE:.0f}%)"
                  f"{'' if ok else '  FAILED'}", flush=True)
            if path != args.model:
                os.remove(path)
        if fx.get("gemma3"):
            if not os.path.exists(args.gemma):
                print(f"{args.gemma} is missing: run scripts/fetch-model.sh gemma3-270m")
                return 1
            want = fx["gemma3"]["llama"]
            got, err = smol_ppl(args.build, args.gemma, text)
            ok = rel(got, want) <= TOLERANCE
            failed += not ok
            print(f"Gemma 3 270M Q4_K_M: smol {got:.4f} ± {err:.4f}, llama.cpp {want:.4f} "
                  f"({100 * (got - want) / want:+.2f}%, allowed ±{100 * TOLERANCE:.0f}%)"
                  f"{'' if ok else '  FAILED'}", flush=True)
        return 1 if failed else 0


KV_TYPES = ["f16", "q8_0", "q4_0"]
KV_TEST_CHUNKS = 2
KV_TEST_BOUNDS = {"q8_0": 0.005, "q4_0": 0.15}


def kv_compare(args):
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "pydoc.txt")
        _, about = write_text(text)
        print(about)
        rows = []
        for t in KV_TYPES:
            s, s_err = smol_ppl(args.build, args.model, text, ["--kv-type", t])
            fa = ["-fa", "on", "-ctk", t, "-ctv", t]
            l, l_err = llama_ppl(args.llama_bin, args.model, text, fa)
            plain = l if t == "f16" else llama_ppl(args.llama_bin, args.model, text, fa,
                                                   {"LLAMA_ATTN_ROT_DISABLE": "1"})[0]
            rows.append((t, s, s_err, l, l_err, plain))
            print(f"{t}: smol {s:.4f}, llama.cpp {l:.4f} (rotation off: {plain:.4f})",
                  flush=True)
        s0, l0 = rows[0][1], rows[0][3]
        print()
        print("| KV type | smol PPL | vs f16 KV | llama.cpp PPL | vs f16 KV "
              "| llama.cpp, rotation off |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for t, s, s_err, l, l_err, plain in rows:
            print(f"| {t} | {s:.4f} ± {s_err:.4f} | {100 * (s - s0) / s0:+.2f}% | "
                  f"{l:.4f} ± {l_err:.4f} | {100 * (l - l0) / l0:+.2f}% | "
                  f"{'-' if t == 'f16' else f'{plain:.4f}'} |")
        return 0


def kv_test(args):
    if not os.path.exists(args.model):
        print(f"{args.model} is missing: run scripts/fetch-model.sh")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        text = os.path.join(tmp, "pydoc.txt")
        _, about = write_text(text)
        print(about)
        want, _ = smol_ppl(args.build, args.model, text, ["--kv-type", "f16"], KV_TEST_CHUNKS)
        print(f"f16 KV: {want:.4f}")
        failed = 0
        for t, bound in KV_TEST_BOUNDS.items():
            got, _ = smol_ppl(args.build, args.model, text, ["--kv-type", t], KV_TEST_CHUNKS)
            ok = rel(got, want) <= bound
            failed += not ok
            print(f"{t} KV: {got:.4f} ({100 * (got - want) / want:+.2f}% of f16 KV, allowed "
                  f"±{100 * bound:.1f}%){'' if ok else '  FAILED'}", flush=True)
        return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["compare", "test", "kv", "kv-test"])
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--gemma", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--llama-bin", default="/work/peers/build-cpu/bin")
    ap.add_argument("--write-fixture")
    ap.add_argument("--fixture", default=os.path.join(ROOT, "tests", "fixtures",
                                                      "perplexity.json"))
    args = ap.parse_args()
    modes = {"compare": compare, "test": test, "kv": kv_compare, "kv-test": kv_test}
    sys.exit(modes[args.mode](args))


if __name__ == "__main__":
    main()
