#!/usr/bin/env python3
"""Reads a GGUF file with the PyPI `gguf` package, an implementation that
shares no code with smol's gguf-io, and either prints what it finds or
checks it against a JSON sidecar that smol wrote (test-gguf writes one for
the file it writes and one for the real model; ctest runs this script on
both as gguf-python-reads-written and gguf-python-reads-model).

    check-gguf.py FILE.gguf                   print metadata and tensor infos
    check-gguf.py FILE.gguf --expect X.json   exit 1 unless they match X.json

The sidecar: {"version", "alignment", "data_offset", "kvs": [{"key",
"value"}], "tensors": [{"name", "type", "ne", "offset", "nbytes", and
"data" (hex) or "head"/"tail" (hex of the first/last 32 bytes)}]}; a value is
{"type": "uint8".."float64"|"bool"|"string", "value": V} or {"type":
"array", "elem": T, "items": [value, ...]}; floats that JSON cannot hold are
"nan", "inf", "-inf"; strings are raw bytes, read with surrogateescape.
"""

import argparse
import json
import math
import sys

try:
    import gguf
    from gguf import GGUFValueType as VT
except ImportError:
    sys.exit("check-gguf: the python package `gguf` is missing; run scripts/setup.sh "
             "(or pip install gguf)")

TYPE_NAMES = {
    VT.UINT8: "uint8", VT.INT8: "int8", VT.UINT16: "uint16", VT.INT16: "int16",
    VT.UINT32: "uint32", VT.INT32: "int32", VT.FLOAT32: "float32", VT.BOOL: "bool",
    VT.STRING: "string", VT.ARRAY: "array", VT.UINT64: "uint64", VT.INT64: "int64",
    VT.FLOAT64: "float64",
}
PSEUDO_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")
MAX_REPORTED = 30


class Mismatch(Exception):
    """A difference after which the reader's parts cannot be walked further."""


def gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "(version unknown)"


def text(raw):
    return raw.tobytes().decode("utf-8", "surrogateescape")


class Checker:
    def __init__(self):
        self.problems = []

    def fail(self, msg):
        self.problems.append(msg)

    def value(self, exp, parts, i, vtype, where):
        """Compares the value whose parts start at parts[i] with exp; returns
        the index after it. The reader splits a value into numpy parts: a
        string into (length, bytes), an array into (element type, count,
        each element's parts), a scalar into one part."""
        name = TYPE_NAMES.get(vtype, f"unknown type {int(vtype)}")
        if exp["type"] != name:
            self.fail(f"{where}: python reads type {name}, smol wrote {exp['type']}")
            raise Mismatch
        if vtype == VT.STRING:
            got = text(parts[i + 1])
            if got != exp["value"]:
                self.fail(f"{where}: python reads {got!r}, smol wrote {exp['value']!r}")
            return i + 2
        if vtype == VT.ARRAY:
            elem = VT(int(parts[i][0]))
            count = int(parts[i + 1][0])
            i += 2
            if TYPE_NAMES[elem] != exp["elem"]:
                self.fail(f"{where}: python reads an array of {TYPE_NAMES[elem]}, "
                          f"smol wrote an array of {exp['elem']}")
                raise Mismatch
            if count != len(exp["items"]):
                self.fail(f"{where}: python reads {count} elements, smol wrote "
                          f"{len(exp['items'])}")
                raise Mismatch
            for k, item in enumerate(exp["items"]):
                i = self.value(item, parts, i, elem, f"{where}[{k}]")
            return i
        got = parts[i][0]
        want = exp["value"]
        if vtype in (VT.FLOAT32, VT.FLOAT64):
            got = float(got)
            if isinstance(want, str):
                ok = math.isnan(got) if want == "nan" else got == float(want)
            else:
                ok = got == want and math.copysign(1, got) == math.copysign(1, want)
        elif vtype == VT.BOOL:
            got = bool(got)
            ok = got == want
        else:
            got = int(got)
            ok = got == want
        if not ok:
            self.fail(f"{where}: python reads {got!r}, smol wrote {want!r}")
        return i + 1

    def metadata(self, reader, expected):
        fields = [f for name, f in reader.fields.items() if name not in PSEUDO_FIELDS]
        got_keys = [f.name for f in fields]
        want_keys = [kv["key"] for kv in expected]
        if got_keys != want_keys:
            self.fail(f"keys differ: python reads {len(got_keys)} keys {got_keys[:8]}..., "
                      f"smol wrote {len(want_keys)} keys {want_keys[:8]}...")
            return
        for field, kv in zip(fields, expected):
            vtype = VT(int(field.parts[2][0]))  # parts: key length, key, type, value...
            try:
                end = self.value(kv["value"], field.parts, 3, vtype, f"key '{kv['key']}'")
                if end != len(field.parts):
                    self.fail(f"key '{kv['key']}': python's reading has parts left over")
            except Mismatch:
                pass

    def tensors(self, reader, expected, data_offset):
        if len(reader.tensors) != len(expected):
            self.fail(f"python reads {len(reader.tensors)} tensors, smol wrote {len(expected)}")
            return
        for t, exp in zip(reader.tensors, expected):
            where = f"tensor '{exp['name']}'"
            got = {
                "name": t.name,
                "type": int(t.tensor_type),
                "ne": [int(x) for x in t.shape],
                "offset": int(t.data_offset) - data_offset,
                "nbytes": int(t.n_bytes),
            }
            for k, v in got.items():
                if v != exp[k]:
                    self.fail(f"{where}: python reads {k} {v!r}, smol says {exp[k]!r}")
            raw = t.data.tobytes()
            if len(raw) != exp["nbytes"]:
                self.fail(f"{where}: python reads {len(raw)} data bytes, smol says "
                          f"{exp['nbytes']}")
            elif "data" in exp and raw.hex() != exp["data"]:
                self.fail(f"{where}: the data bytes differ")
            elif "head" in exp and (raw[:32].hex() != exp["head"]
                                    or raw[-32:].hex() != exp["tail"]):
                self.fail(f"{where}: the first or last 32 data bytes differ")


def check(path, reader, sidecar_path):
    with open(sidecar_path, encoding="utf-8", errors="surrogateescape") as f:
        expected = json.load(f)
    c = Checker()
    version = int(reader.fields["GGUF.version"].parts[0][0])
    for what, got in (("version", version), ("alignment", int(reader.alignment)),
                      ("data_offset", int(reader.data_offset))):
        if got != expected[what]:
            c.fail(f"python reads {what} {got}, smol says {expected[what]}")
    c.metadata(reader, expected["kvs"])
    c.tensors(reader, expected["tensors"], int(reader.data_offset))
    if c.problems:
        for p in c.problems[:MAX_REPORTED]:
            print(f"check-gguf: {path}: {p}", file=sys.stderr)
        if len(c.problems) > MAX_REPORTED:
            print(f"check-gguf: ... and {len(c.problems) - MAX_REPORTED} more", file=sys.stderr)
        return 1
    print(f"check-gguf: {path}: python's gguf {gguf_version()} reads the "
          f"same {len(expected['kvs'])} keys and {len(expected['tensors'])} tensors "
          f"(types, values, offsets, bytes) as {sidecar_path}")
    return 0


def decode(parts, i, vtype):
    """The value whose reader parts start at parts[i], and the index after it."""
    if vtype == VT.STRING:
        return text(parts[i + 1]), i + 2
    if vtype == VT.ARRAY:
        elem = VT(int(parts[i][0]))
        count = int(parts[i + 1][0])
        i += 2
        items = []
        for _ in range(count):
            item, i = decode(parts, i, elem)
            items.append(item)
        return items, i
    return parts[i][0].item(), i + 1


def show(reader):
    for name, f in reader.fields.items():
        if name in PSEUDO_FIELDS:
            continue
        vtype = VT(int(f.parts[2][0]))
        v, _ = decode(f.parts, 3, vtype)
        if vtype == VT.ARRAY:
            elem = TYPE_NAMES[VT(int(f.parts[3][0]))]
            more = " ..." if len(v) > 4 else ""
            print(f"{name}: array of {elem} [{len(v)}] {v[:4]!r}{more}")
        else:
            print(f"{name}: {TYPE_NAMES[vtype]} {v!r}")
    print(f"version {int(reader.fields['GGUF.version'].parts[0][0])}, alignment "
          f"{reader.alignment}, tensor data from byte {reader.data_offset}")
    for t in reader.tensors:
        print(f"{t.name}: {t.tensor_type.name} ne {[int(x) for x in t.shape]} "
              f"at +{int(t.data_offset) - reader.data_offset} ({int(t.n_bytes)} bytes)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="the GGUF file to read")
    ap.add_argument("--expect", metavar="JSON", help="the sidecar to check against")
    args = ap.parse_args()
    try:
        reader = gguf.GGUFReader(args.file)
    except FileNotFoundError:
        print(f"check-gguf: {args.file} is missing (for the model: run scripts/fetch-model.sh)",
              file=sys.stderr)
        return 1
    except Exception as e:  # the reader raises many kinds on a bad file
        print(f"check-gguf: {args.file}: python's gguf cannot read it: {e}", file=sys.stderr)
        return 1
    if args.expect:
        return check(args.file, reader, args.expect)
    return show(reader)


if __name__ == "__main__":
    sys.exit(main())
