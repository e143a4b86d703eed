#!/usr/bin/env python3
"""Structured output from smol-server on the real model, checked by the
`jsonschema` package.

Starts smol-server on a free loopback port and asks, through the official
`openai` client, for output under response_format json_schema (schemas in
the shape of real APIs' examples: a weather tool's arguments, a user record
with a nested address and enums, an order of items with minItems and
maxItems, a result that is anyOf two shapes, an event with $defs, formats
and a nullable field, a top-level array), json_object, and a GBNF
'grammar', over many seeds at temperature 1. Every output must parse and
validate. Bad schemas and grammars must be 400s (413 past the size limit)
that name the field and point at the fault.

    tests/test-structured-output.py build/examples/smol-server MODEL [SEEDS] [BASE_SEED]

SEEDS (default 6) requests per schema; the seeds are BASE_SEED + i, and
BASE_SEED (default: fresh) is printed so a failure replays.
"""

import concurrent.futures
import http.client
import json
import random
import re
import subprocess
import sys
import tempfile
import time

try:
    import jsonschema
    import openai
except ImportError as e:
    print(f"test-structured-output: FAIL: {e.name} is missing; scripts/setup.sh installs it "
          "(python3 -m pip install openai jsonschema)", file=sys.stderr)
    sys.exit(1)

SERVER, MODEL = sys.argv[1], sys.argv[2]
SEEDS = int(sys.argv[3]) if len(sys.argv) > 3 else 6
BASE = int(sys.argv[4]) if len(sys.argv) > 4 else random.randrange(1 << 30)
from checks import check, failures  # noqa: E402


SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "City and country, e.g. Paris, France",
                         "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location", "unit"],
        "additionalProperties": False,
    },
    "user": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 30},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string", "format": "email", "maxLength": 40},
            "role": {"enum": ["admin", "editor", "viewer"]},
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 40},
                    "city": {"type": "string", "maxLength": 30},
                    "zip": {"type": "string", "minLength": 5, "maxLength": 5},
                    "country": {"enum": ["US", "FR", "DE", "JP"]},
                },
                "required": ["street", "city", "country"],
                "additionalProperties": False,
            },
            "verified": {"type": "boolean"},
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 12},
                        "quantity": {"type": "integer", "minimum": 1},
                        "price": {"type": "number"},
                    },
                    "required": ["sku", "quantity"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            },
            "express": {"type": "boolean"},
        },
        "required": ["items", "express"],
        "additionalProperties": False,
    },
    "result": {
        "type": "object",
        "properties": {
            "result": {
                "anyOf": [
                    {"type": "object",
                     "properties": {"status": {"const": "ok"}, "value": {"type": "number"}},
                     "required": ["status", "value"], "additionalProperties": False},
                    {"type": "object",
                     "properties": {"status": {"const": "error"},
                                    "message": {"type": "string", "maxLength": 40}},
                     "required": ["status", "message"], "additionalProperties": False},
                ]
            }
        },
        "required": ["result"],
        "additionalProperties": False,
    },
    "event": {
        "$defs": {
            "person": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 20},
                               "id": {"type": "string", "format": "uuid"}},
                "required": ["name", "id"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "organizer": {"$ref": "#/$defs/person"},
            "attendees": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 2},
            "notes": {"type": ["string", "null"], "maxLength": 20},
        },
        "required": ["title", "when", "organizer", "attendees", "notes"],
        "additionalProperties": False,
    },
    "colors": {
        "type": "array",
        "items": {"enum": ["red", "green", "blue", "cyan", "magenta"]},
        "minItems": 2,
        "maxItems": 4,
    },
}

PROMPTS = {
    "get_weather": "What's the weather like in Boston today? Give the tool's arguments.",
    "user": "Make up a user record for a new editor living in Lyon.",
    "order": "Order two notebooks and a pen, please.",
    "result": "Divide 10 by 4 and report the result.",
    "event": "Plan a team lunch next Friday at noon.",
    "colors": "Name a few colors.",
}

FORMATS = {"date": r"\d{4}-\d{2}-\d{2}",
           "date-time": r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
           "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"}


def format_checker():
    """jsonschema's own checker, with the formats smol's grammar enforces
    checked by pattern (its date-time needs an optional package)."""
    fc = jsonschema.FormatChecker(formats=())
    for name, pattern in FORMATS.items():
        fc.checks(name)(lambda s, p=pattern: not isinstance(s, str) or re.fullmatch(p, s))
    return fc


def start_server(log):
    proc = subprocess.Popen(
        [SERVER, "--model", MODEL, "--host", "127.0.0.1", "--port", "0", "--parallel", "4",
         "-c", "4096", "-t", "2", "--max-body", str(1 << 20)],
        stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        proc.kill()
        sys.exit("test-structured-output: FAIL: smol-server did not start: " + line)
    return proc, int(line.rsplit(":", 1)[1])


def post(port, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data)


def main():
    print(f"test-structured-output: base seed {BASE} (pass it as the 4th argument to replay)")
    log = tempfile.TemporaryFile(mode="w+")
    proc, port = start_server(log)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        fc = format_checker()

        def ask(name, seed):
            r = client.chat.completions.create(
                model=model, seed=seed, temperature=1.0, max_tokens=400,
                messages=[{"role": "user", "content": PROMPTS[name]}],
                response_format={"type": "json_schema",
                                 "json_schema": {"name": name, "schema": SCHEMAS[name],
                                                 "strict": True}})
            return name, seed, r.choices[0].message.content, r.choices[0].finish_reason

        jobs = [(name, BASE + i) for name in SCHEMAS for i in range(SEEDS)]
        n_valid = 0
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for name, seed, text, finish in pool.map(lambda a: ask(*a), jobs):
                try:
                    jsonschema.validate(json.loads(text), SCHEMAS[name], format_checker=fc)
                    ok, why = True, ""
                except (ValueError, jsonschema.ValidationError) as e:
                    ok, why = False, f": {type(e).__name__}: {str(e)[:200]}"
                n_valid += ok
                if not ok:
                    check(False, f"{name} seed {seed} (finish {finish}) gives valid JSON{why}; "
                          f"text {text!r}")
        check(n_valid == len(jobs),
              f"{n_valid} of {len(jobs)} json_schema outputs parse and validate "
              f"({len(SCHEMAS)} schemas x {SEEDS} seeds, temperature 1)")
        for name in SCHEMAS:
            print(f"    {name}: {ask(name, BASE)[2]}")

        # json_object: any JSON object. Nothing bounds its size, so a text cut
        # by max_tokens is only counted; every text that stopped must be one.
        n_obj = n_cut = 0
        for i in range(SEEDS):
            r = client.chat.completions.create(
                model=model, seed=BASE + i, temperature=1.0, max_tokens=400,
                messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                response_format={"type": "json_object"})
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            if finish == "length":
                n_cut += 1
                continue
            try:
                n_obj += isinstance(json.loads(text), dict)
            except ValueError:
                print(f"    seed {BASE + i} (finish {finish}): {text[-300:]!r}")
        check(n_obj == SEEDS - n_cut and n_cut < SEEDS,
              f"{n_obj} of {SEEDS - n_cut} json_object outputs that stopped are JSON objects "
              f"({n_cut} cut by max_tokens)")

        # A GBNF grammar, in completions and chat.
        gbnf = 'root ::= ("yes" | "no") ", " [1-9] [0-9]? " " ( "apples" | "pears" )\n'
        n_gram = 0
        for i in range(SEEDS):
            r = client.completions.create(model=model, prompt="Do you like fruit?", seed=BASE + i,
                                          temperature=1.0, max_tokens=20,
                                          extra_body={"grammar": gbnf})
            c = client.chat.completions.create(
                model=model, seed=BASE + i, temperature=1.0, max_tokens=20,
                messages=[{"role": "user", "content": "Do you like fruit?"}],
                extra_body={"grammar": gbnf})
            for text in (r.choices[0].text, c.choices[0].message.content):
                n_gram += bool(re.fullmatch(r"(yes|no), [1-9][0-9]? (apples|pears)", text))
        check(n_gram == 2 * SEEDS, f"{n_gram} of {2 * SEEDS} 'grammar' outputs match it")

        # Faults: 400 (413 past the size limit), naming the field and the place.
        chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        bad = [
            ({"grammar": 'root ::= "a" (\n'}, 400, "grammar", "line 1, column 14"),
            ({"grammar": "root ::= x\n"}, 400, "grammar", "rule 'x' is not defined"),
            ({"grammar": 'root ::= root "a" | "b"\n'}, 400, "grammar", "left-recursive"),
            ({"grammar": "x" * 70000}, 413, "grammar", "at most 65536"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$"}}}}}},
             400, "response_format", "#/properties/a/pattern"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "$ref": "#/$defs/nope"}}}}, 400, "response_format", "names nothing"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
             "response_format", "schema"),
            ({"response_format": {"type": "xml"}}, 400, "response_format", "'xml'"),
            ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\"\n"}, 400,
             "grammar", "both"),
        ]
        deep = {"type": "string"}
        for _ in range(80):
            deep = {"type": "array", "items": deep}
        bad.append(({"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": deep}}},
                    400, "response_format", "nests deeper"))
        big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}
        bad.append(({"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": big}}},
                    413, "response_format", "at most 65536"))
        for extra, status, param, part in bad:
            for path, body in (("/v1/chat/completions", chat),
                               ("/v1/completions", {"model": model, "prompt": "hi",
                                                    "max_tokens": 4})):
                got, reply = post(port, path, {**body, **extra})
                err = reply.get("error", {})
                check(got == status and err.get("param") == param and
                      part in err.get("message", ""),
                      f"{path} {json.dumps(extra)[:60]}... -> {got} {err.get('param')}: "
                      f"{err.get('message', '')[:120]!r}")
        # The server still serves.
        r = client.chat.completions.create(model=model, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        check(r.choices[0].message.content is not None, "the server answers after the faults")
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        check(rc == 0, f"smol-server exits 0 on SIGTERM (exit status {rc})")
        if failures:
            log.seek(0)
            print(log.read()[-4000:])
    if failures:
        print(f"test-structured-output: FAIL: {len(failures)} checks failed (base seed {BASE})")
        sys.exit(1)
    print("test-structured-output: OK")


main()
