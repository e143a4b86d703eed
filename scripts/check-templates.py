#!/usr/bin/env python3
"""smol's chat templates against Python's jinja2, the interpreter that
transformers renders them with.

Every *.jinja of llama.cpp's corpus (models/templates) is rendered over a
set of conversations (with and without a system message, one and several
turns, with tools and a tool call answered by a tool, each with and without
the generation prompt) twice: by jinja2 in HF's environment
(ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop
controls and the generation tag; HF's tojson, raise_exception and
strftime_now) and by smol (tests/render-template.c++). Per template and
conversation the outcome is: identical; refused by smol (it names what it
does not implement); raised by jinja2 (skipped; counted whether smol refuses
too); or DIFFERENT. Exits 1 if any case differs, or smol fails for another
reason than a construct it does not support where jinja2 rendered; 77 (a
ctest skip) when the templates or jinja2 are missing.

usage: check-templates.py --render build/tests/render-template
                          [--templates DIR] [--only NAME] [--show-diff]
"""

import argparse
import datetime
import difflib
import json
import os
import subprocess
import sys

DEFAULT_TEMPLATES = "/work/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates"
# A fixed clock for strftime_now (2025-03-14 15:09:26 UTC); both renderers
# run with TZ=UTC.
NOW = 1741964966
BOS, EOS = "<s>", "</s>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT = {"role": "assistant", "content": "The capital of France is Paris."}
USER2 = {"role": "user", "content": "And of Italy? Answer in \"one\" word, it's 'easy'."}
USER_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"},
        }
    ],
}
TOOL = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21}"}
ANSWER = {"role": "assistant", "content": "It is 21 °C in Paris."}
USER3 = {"role": "user", "content": "Thanks!\nBye."}

CONVERSATIONS = [
    ("user", [USER], None),
    ("system, user", [SYSTEM, USER], None),
    ("system, three turns", [SYSTEM, USER, ASSISTANT, USER2], None),
    ("three turns", [USER, ASSISTANT, USER2], None),
    ("tools", [SYSTEM, USER_WEATHER], TOOLS),
    ("tool call", [USER_WEATHER, CALL, TOOL], TOOLS),
    ("tool call, answered", [SYSTEM, USER_WEATHER, CALL, TOOL, ANSWER, USER3], TOOLS),
]


def cases():
    out = []
    for name, messages, tools in CONVERSATIONS:
        for gen in (True, False):
            out.append({"name": f"{name}, add_generation_prompt={gen}", "messages": messages,
                        "tools": tools, "add_generation_prompt": gen})
    return out


def for_jinja2(messages):
    """The messages as smol hands them to its template: a tool call's
    arguments as an object, a missing content as "" (llama.cpp's way)."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        if m.get("content") is None:
            m["content"] = ""
        for call in m.get("tool_calls", []):
            args = call.get("function", {}).get("arguments")
            if isinstance(args, str):
                call["function"]["arguments"] = json.loads(args)
        out.append(m)
    return out


def make_env():
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class AssistantTracker(jinja2.ext.Extension):
        # transformers' {% generation %}: the body renders as it is.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        def _generation_support(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_jinja2(env, source, case):
    try:
        tmpl = env.from_string(source)
    except Exception as e:  # noqa: BLE001 - any failure is the outcome
        return None, f"{type(e).__name__}: {e}"
    kwargs = {"messages": for_jinja2(case["messages"]), "add_generation_prompt": case["add_generation_prompt"],
              "bos_token": BOS, "eos_token": EOS}
    if case["tools"] is not None:
        kwargs["tools"] = case["tools"]
    try:
        return tmpl.render(**kwargs), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", required=True, help="the render-template program")
    ap.add_argument("--emulator", default="",
                    help="a cross-built renderer's emulator and its arguments, ';'-separated "
                         "(CMake's CMAKE_CROSSCOMPILING_EMULATOR)")
    ap.add_argument("--templates", default=os.path.join(
        os.environ.get("SMOL_LLAMA_CPP_SOURCE", DEFAULT_TEMPLATES.rsplit("/models/", 1)[0]), "models/templates"))
    ap.add_argument("--only", help="check only templates whose file name contains this")
    ap.add_argument("--show-diff", action="store_true", help="print a diff for each different case")
    args = ap.parse_args()
    os.environ["TZ"] = "UTC"

    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("skip: jinja2 is not installed (pip install jinja2)")
        return 77
    if not os.path.isdir(args.templates):
        print(f"skip: no template corpus at {args.templates} (scripts/peers.sh --sources unpacks it)")
        return 77
    names = sorted(f for f in os.listdir(args.templates) if f.endswith(".jinja"))
    if args.only:
        names = [n for n in names if args.only in n]
    if not names:
        print(f"skip: no *.jinja in {args.templates}")
        return 77

    sources = {}
    for n in names:
        with open(os.path.join(args.templates, n), encoding="utf-8") as f:
            sources[n] = f.read()
    all_cases = cases()
    job = {"now": NOW, "cases": all_cases,
           "templates": [{"name": n, "source": sources[n], "bos_token": BOS, "eos_token": EOS} for n in names]}
    render = [a for a in args.emulator.split(";") if a] + [args.render]
    proc = subprocess.run(render, input=json.dumps(job), capture_output=True, text=True,
                          env=dict(os.environ, TZ="UTC"))
    if proc.returncode != 0:
        print(f"{' '.join(render)} failed ({proc.returncode}):\n{proc.stderr}")
        return 1
    smol = json.loads(proc.stdout)

    env = make_env()
    rows = []
    failed = False
    totals = {"identical": 0, "refused": 0, "raised": 0, "raised_refused": 0, "different": 0}
    for n in names:
        r = {"identical": 0, "refused": 0, "raised": 0, "raised_refused": 0, "different": 0,
             "reasons": set(), "wrong": []}
        for case, got in zip(all_cases, smol[n]):
            want, raised = render_jinja2(env, sources[n], case)
            if raised is not None:
                r["raised"] += 1
                if "error" in got:
                    r["raised_refused"] += 1
                continue
            if "error" in got:
                if got["status"] == "SMOL_ERR_UNSUPPORTED":
                    r["refused"] += 1
                    r["reasons"].add(got["error"])
                else:
                    r["different"] += 1
                    r["wrong"].append((case["name"], f"smol failed where jinja2 rendered: {got['error']}"))
                continue
            if got["text"] == want:
                r["identical"] += 1
            else:
                r["different"] += 1
                diff = "".join(difflib.unified_diff(want.splitlines(True), got["text"].splitlines(True),
                                                    "jinja2", "smol", n=1))
                r["wrong"].append((case["name"], diff))
        for k in totals:
            totals[k] += r[k]
        rows.append((n, r))

    width = max(len(n) for n in names)
    print(f"{'template':<{width}}  identical  refused  jinja2-raised (smol refused)  different")
    for n, r in rows:
        print(f"{n:<{width}}  {r['identical']:>9}  {r['refused']:>7}  {r['raised']:>13} ({r['raised_refused']:>2})"
              f"            {r['different']:>9}")
    print()
    all_ok = [n for n, r in rows if r["identical"] == len(all_cases) - r["raised"] and r["identical"] > 0]
    refused = [(n, r) for n, r in rows if r["refused"]]
    different = [(n, r) for n, r in rows if r["different"]]
    only_raised = [n for n, r in rows if r["raised"] == len(all_cases)]
    print(f"{len(all_ok)} of {len(names)} templates render identically to jinja2 in every case jinja2 renders")
    print(f"cases: {totals['identical']} identical, {totals['refused']} refused by smol, "
          f"{totals['raised']} raised by jinja2 (smol refused {totals['raised_refused']} of them), "
          f"{totals['different']} different")
    if only_raised:
        print(f"jinja2 rendered no case of: {', '.join(only_raised)}")
    for n, r in refused:
        print(f"refused: {n} ({r['refused']} cases): {'; '.join(sorted(r['reasons']))}")
    for n, r in different:
        failed = True
        for case_name, detail in r["wrong"]:
            print(f"DIFFERENT: {n} [{case_name}]")
            if args.show_diff:
                print(detail)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
