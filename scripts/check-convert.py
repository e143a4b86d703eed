#!/usr/bin/env python3
"""smol-convert against llama.cpp's convert_hf_to_gguf.py, read with the
independent `gguf` package: the same metadata (keys, order, types, values)
and the same tensors (names, order, types, shapes, bytes).

    check-convert.py compare SMOL.gguf LLAMA.gguf
        prints every difference; exit 1 if any.
    check-convert.py test --smol-convert BIN --vocab-from SmolLM2.gguf
                          --llama-cpp LLAMA_CPP_SOURCE [--python PY]
        writes random HF checkpoints (scripts/make-hf-checkpoint.py, a fresh
        seed, printed; SMOL_TEST_SEED replays one) in f32, bf16 and f16,
        sharded and not, converts each with both tools to f32, f16, bf16 and
        q8_0, and compares. Where LLAMA_BIN has llama-quantize, smol-convert's
        K-quant and legacy types are compared too, with llama-quantize's
        requantization of convert_hf_to_gguf.py's f32 file. Then random
        Gemma 3 checkpoints (scripts/make-hf-gemma3.py, run by PY: it needs
        sentencepiece) the same way, to f32, f16, bf16, q8_0 and the
        llama-quantize types. PY runs
        convert_hf_to_gguf.py (it needs torch, transformers, sentencepiece,
        safetensors); where they are missing, or the sources are, the test
        is skipped (exit status 77).
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

try:
    import gguf
    import numpy as np
except ImportError as e:
    print(f"check-convert: skipped: {e.name} is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))


def fields(path):
    r = gguf.GGUFReader(path)
    out = []
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        types = [gguf.GGUFValueType(t).name for t in f.types]
        out.append((key, types, f.contents()))
    return r, out


def compare(smol_path, llama_path):
    """Differences between the two files, as lines of text."""
    rs, fs_ = fields(smol_path)
    rl, fl = fields(llama_path)
    diffs = []
    ks, kl = [k for k, _, _ in fs_], [k for k, _, _ in fl]
    for k in kl:
        if k not in ks:
            diffs.append(f"key {k}: only llama.cpp writes it")
    for k in ks:
        if k not in kl:
            diffs.append(f"key {k}: only smol writes it")
    common_s = [k for k in ks if k in kl]
    common_l = [k for k in kl if k in ks]
    if common_s != common_l:
        diffs.append(f"key order differs: smol {common_s} llama.cpp {common_l}")
    ls = {k: (t, v) for k, t, v in fl}
    for k, t, v in fs_:
        if k not in ls:
            continue
        lt, lv = ls[k]
        if t != lt:
            diffs.append(f"key {k}: type {t} vs llama.cpp {lt}")
        elif v != lv:
            shown = repr(v)[:80], repr(lv)[:80]
            diffs.append(f"key {k}: {shown[0]} vs llama.cpp {shown[1]}")
    ns = [t.name for t in rs.tensors]
    nl = [t.name for t in rl.tensors]
    if ns != nl:
        diffs.append(f"tensor names or order differ: smol {ns} llama.cpp {nl}")
    tl = {t.name: t for t in rl.tensors}
    same = 0
    for t in rs.tensors:
        o = tl.get(t.name)
        if o is None:
            continue
        if t.tensor_type != o.tensor_type:
            diffs.append(f"tensor {t.name}: {t.tensor_type.name} vs llama.cpp {o.tensor_type.name}")
        elif list(t.shape) != list(o.shape):
            diffs.append(f"tensor {t.name}: shape {list(t.shape)} vs llama.cpp {list(o.shape)}")
        elif t.data.tobytes() != o.data.tobytes():
            a = np.frombuffer(t.data.tobytes(), np.uint8)
            b = np.frombuffer(o.data.tobytes(), np.uint8)
            diffs.append(f"tensor {t.name}: {int((a != b).sum())} of {a.size} bytes differ")
        else:
            same += 1
    return diffs, same, len(rl.tensors), len(fs_)


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
        raise SystemExit(f"check-convert: failed ({r.returncode}): {' '.join(cmd)}")
    return r


def test(a):
    convert = os.path.join(a.llama_cpp, "convert_hf_to_gguf.py")
    if not os.path.isfile(convert):
        print(f"check-convert: skipped: {convert} is absent (scripts/peers.sh --sources)")
        return 77
    probe = subprocess.run([a.python, "-c", "import torch, transformers, sentencepiece, "
                            "safetensors, tokenizers, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"check-convert: skipped: {a.python} cannot run convert_hf_to_gguf.py ({last}); "
              "pip install torch transformers sentencepiece safetensors tokenizers")
        return 77
    llama_cases = os.path.isfile(a.vocab_from)
    if not llama_cases:
        print(f"check-convert: the Llama cases are skipped: {a.vocab_from} is absent "
              "(scripts/fetch-model.sh); the Gemma 3 ones run")
    seed = int(os.environ.get("SMOL_TEST_SEED", random.SystemRandom().randrange(1 << 31)))
    print(f"check-convert: seed {seed} (SMOL_TEST_SEED={seed} replays it)")
    tmp = tempfile.mkdtemp(prefix="smol-check-convert-")
    failures = 0
    try:
        quantize = os.path.join(a.llama_bin, "llama-quantize")
        requant = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "Q5_1"] if os.access(quantize, os.X_OK) \
            else []
        if not requant:
            print(f"check-convert: {quantize} is absent: the quantized types are not compared "
                  "(scripts/peers.sh builds it)")
        def outputs(tag, label, qlabel, model, types, qtypes):
            """smol-convert's file of each type against convert_hf_to_gguf.py's,
            and of each quantized type against llama-quantize's of that
            converter's f32; prints each; returns how many differ."""
            bad = 0

            def same(ours, theirs, what):
                diffs, equal, n, n_keys = compare(ours, theirs)
                status = "identical" if not diffs else f"{len(diffs)} difference(s)"
                print(f"check-convert: {what}: {equal}/{n} tensors byte-identical, "
                      f"{n_keys} keys; {status}")
                for d in diffs:
                    print("    " + d)
                return bool(diffs)

            for t in types:
                ours = os.path.join(tmp, f"smol-{tag}-{t}.gguf")
                theirs = os.path.join(tmp, f"llama-{tag}-{t}.gguf")
                run([a.smol_convert, model, ours, "--type", t, "--name", "tiny"])
                run([a.python, convert, model, "--outfile", theirs, "--outtype", t,
                     "--model-name", "tiny"], cwd=tmp)
                bad += same(ours, theirs, f"{label} -> {t}")
            if qtypes:
                f32 = os.path.join(tmp, f"llama-{tag}-f32.gguf")
                run([a.python, convert, model, "--outfile", f32, "--outtype", "f32",
                     "--model-name", "tiny"], cwd=tmp)
            for t in qtypes:
                ours = os.path.join(tmp, f"smol-{tag}-{t}.gguf")
                theirs = os.path.join(tmp, f"llama-{tag}-{t}.gguf")
                run([a.smol_convert, model, ours, "--type", t, "--name", "tiny"])
                run([quantize, f32, theirs, t], env=dict(os.environ, LD_LIBRARY_PATH=a.llama_bin))
                bad += same(ours, theirs, f"{qlabel} -> {t} (llama-quantize's of "
                            "convert_hf_to_gguf's f32)")
            return bad

        # The last checkpoint's rows (256, 512) fill K-quant blocks, so
        # its weights get the recipes' K-quants rather than their fallbacks.
        cases = [("f32", 1, ["f32", "f16", "bf16", "q8_0"], []),
                 ("bf16", 2, ["f32", "f16", "bf16"], []),
                 ("f16", 1, ["f32", "f16", "bf16"], []),
                 ("f32", 1, [], requant)]
        for i, (dtype, shards, types, qtypes) in enumerate(cases if llama_cases else []):
            if not types and not qtypes:
                continue
            model = os.path.join(tmp, f"tiny-{i}-{dtype}")
            shape = ["--hidden", "256", "--ff", "512"] if qtypes else []
            r = subprocess.run([sys.executable, os.path.join(HERE, "make-hf-checkpoint.py"), model,
                                "--vocab-from", a.vocab_from, "--seed", str(seed + i),
                                "--dtype", dtype, "--shards", str(shards)] + shape,
                               capture_output=True, text=True)
            if r.returncode == 77:
                print(r.stdout.strip())
                return 77
            if r.returncode != 0:
                sys.stderr.write(r.stdout + r.stderr)
                return 1
            failures += outputs(f"tiny-{i}", f"{dtype} checkpoint, {shards} shard(s)",
                                f"{dtype} checkpoint (rows 256, 512)", model, types, qtypes)
        # The f16 checkpoint has a tokenizer.json beside tokenizer.model,
        # as Gemma's do: its added tokens and post-processor count too. The
        # bf16 one has linear RoPE scaling and a final soft-cap (Gemma 3
        # 4B's and Gemma 2's settings). The last one's rows (256, 512) fill
        # K-quant blocks.
        wide = ["--hidden", "256", "--ff", "512", "--head-dim", "64"]
        gemma_cases = [("f32", 1, ["f32", "f16", "bf16", "q8_0"], [], []),
                       ("bf16", 2, ["f32", "f16", "bf16"], [],
                        ["--rope-linear", "8", "--softcap", "30"]),
                       ("f16", 1, ["f32", "f16", "bf16"], [], ["--tokenizer-json"]),
                       ("f32", 1, [], requant, wide)]
        for i, (dtype, shards, types, qtypes, extra) in enumerate(gemma_cases):
            if not types and not qtypes:
                continue
            model = os.path.join(tmp, f"gemma3-{i}-{dtype}")
            made = run([a.python, os.path.join(HERE, "make-hf-gemma3.py"), model, "--seed",
                        str(seed + 10 + i), "--dtype", dtype, "--shards", str(shards),
                        "--check-transformers"] + extra)
            for line in made.stdout.splitlines():
                if "transformers' logits" in line:
                    print(f"check-convert: Gemma 3 {dtype} checkpoint {i}: " +
                          line.split(": ", 1)[1])
            what = " and tokenizer.json" if "--tokenizer-json" in extra else ""
            failures += outputs(f"gemma3-{i}",
                                f"Gemma 3 {dtype} checkpoint{what}, {shards} shard(s)",
                                f"Gemma 3 {dtype} checkpoint (rows 256, 512)", model, types, qtypes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"check-convert: {'FAILED' if failures else 'passed'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("smol")
    c.add_argument("llama")
    t = sub.add_parser("test")
    t.add_argument("--smol-convert", required=True)
    t.add_argument("--vocab-from", required=True)
    t.add_argument("--llama-cpp", required=True)
    t.add_argument("--python", default=sys.executable)
    t.add_argument("--llama-bin", default="/work/peers/build-cpu/bin",
                   help="where llama-quantize is (scripts/peers.sh builds it)")
    a = ap.parse_args()
    if a.cmd == "compare":
        diffs, same, n, n_keys = compare(a.smol, a.llama)
        print(f"{same}/{n} tensors byte-identical, {n_keys} keys, {len(diffs)} difference(s)")
        for d in diffs:
            print("    " + d)
        return 1 if diffs else 0
    return test(a)


if __name__ == "__main__":
    sys.exit(main())
