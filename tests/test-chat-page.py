#!/usr/bin/env python3
"""smol-server's chat page in a real browser (headless Chromium through
Selenium), on the real model.

Starts smol-server with an API key on a free loopback port and checks: the
page is served at / and /index.html without a key while the API needs one;
with the key typed in, the page names the server's model; a message sent
streams its answer (the text grows while it is being written), which ends
equal to the same request's non-streamed answer (greedy), with its tokens/s
shown; the next request carries the conversation, the system prompt,
temperature, max tokens and the key; a long answer stops growing when Stop
is pressed, the server is told (its request ends and counts as a client
disconnect), and the page takes the next message. Skips (77) where
chromium, chromedriver or the Python package selenium is missing.

    tests/test-chat-page.py build/examples/smol-server models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(why):
    print(f"test-chat-page: SKIP: {why}")
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:
    skip("the Python package 'selenium' is missing (scripts/setup.sh installs it: "
         "python3 -m pip install selenium)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if not CHROMIUM or not CHROMEDRIVER:
    skip("chromium or chromedriver is missing (Debian: apt-get install chromium chromium-driver)")

SERVER, MODEL = sys.argv[1], sys.argv[2]
KEY = "page-test-key"
from checks import check, failures  # noqa: E402


def raw(port, method, path, body=None, key=None):
    """One plain HTTP request; returns (status, content type, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, r.getheader("Content-Type", ""), data


def metrics(port):
    _, _, text = raw(port, "GET", "/metrics", key=KEY)
    return {k: float(v) for k, v in (line.split() for line in text.splitlines()
                                     if line and not line.startswith("#"))}


def wait_for(what, cond, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    return None


# Records every request body and Authorization header the page sends.
RECORD_FETCH = """
window.sent = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (init && init.body) window.sent.push({url: String(url), body: JSON.parse(init.body),
                                           auth: (init.headers || {})["Authorization"] || null});
  return realFetch(url, init);
};
"""


def main():
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [SERVER, "--model", MODEL, "--port", "0", "-c", "2048", "--parallel", "2", "-t", "2",
         "--api-key", KEY], stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if not line.startswith("listening on http://127.0.0.1:"):
        proc.kill()
        log.seek(0)
        sys.exit("test-chat-page: FAIL: smol-server did not start: " + line + log.read())
    port = int(line.rsplit(":", 1)[1])
    base = f"http://127.0.0.1:{port}"
    driver = None
    try:
        for path in ("/", "/index.html"):
            status, ctype, body = raw(port, "GET", path)
            check(status == 200 and ctype.startswith("text/html") and "<html" in body,
                  f"GET {path} without a key: the page ({status}, {ctype})")
        status, _, _ = raw(port, "GET", "/v1/models")
        check(status == 401, f"GET /v1/models without a key: 401 ({status})")
        model = json.loads(raw(port, "GET", "/v1/models", key=KEY)[2])["data"][0]["id"]

        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-extensions", "--window-size=1200,900"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
        driver.set_script_timeout(30)
        driver.get(base + "/")
        driver.execute_script(RECORD_FETCH)
        el = lambda id: driver.find_element(By.ID, id)  # noqa: E731

        # Without the key the page cannot name the model; with it, it can.
        shown = wait_for("model", lambda: "unknown" in el("model").text and el("model").text, 10)
        check(shown, f"without a key the page says the model is unknown ({shown!r})")
        el("api-key").send_keys(KEY, Keys.TAB)  # a change event
        shown = wait_for("model", lambda: el("model").text == "model: " + model, 10)
        check(shown, f"with the key the page names the model ({el('model').text!r})")

        def answers():
            return driver.find_elements(By.CSS_SELECTOR, "#log .msg.assistant")

        def follow(answer, timeout, stop_after=None):
            """Samples the answer's text while it streams; returns the
            distinct lengths seen. With stop_after, presses Stop once that
            many distinct non-empty lengths were seen."""
            lengths = []
            end = time.time() + timeout
            while time.time() < end:
                n = len(answer.find_element(By.CLASS_NAME, "text").text)
                if n and (not lengths or lengths[-1] != n):
                    lengths.append(n)
                if stop_after and len(lengths) >= stop_after:
                    el("stop").click()
                    return lengths
                if not el("stop").is_enabled() and not el("send").get_attribute("disabled"):
                    return lengths
                time.sleep(0.02)
            return lengths

        def say(text):
            el("message").send_keys(text)
            el("send").click()
            return wait_for("answer", lambda: len(answers()) > n_before and answers()[-1], 10)

        # A first message, greedy: streamed in pieces, the same text as the
        # non-streamed answer, tokens/s shown.
        el("temperature").clear()
        el("temperature").send_keys("0")
        el("max-tokens").clear()
        el("max-tokens").send_keys("96")
        question = "Write a short poem about the sea."
        n_before = len(answers())
        answer = say(question)
        check(answer, "sending a message adds an answer")
        check(el("stop").is_enabled(), "Stop is enabled while the answer streams")
        lengths = follow(answer, 120)
        check(len(lengths) >= 3 and lengths == sorted(lengths),
              f"the answer's text grows while it streams (lengths seen: {lengths[:12]})")
        text = answer.find_element(By.CLASS_NAME, "text").text
        stats = answer.find_element(By.CLASS_NAME, "stats").text
        m = re.search(r"^(\d+) tokens · ([\d.]+) tokens/s", stats)
        check(m and 1 < int(m.group(1)) <= 96 and float(m.group(2)) > 0,
              f"tokens/s is shown for the answer ({stats!r})")
        _, _, body = raw(port, "POST", "/v1/chat/completions", key=KEY, body=json.dumps({
            "model": model, "temperature": 0, "max_tokens": 96,
            "messages": [{"role": "user", "content": question}]}))
        want = json.loads(body)["choices"][0]["message"]["content"]
        # The browser's text of an element drops trailing blanks.
        check(text == want.strip(), f"the streamed answer equals the non-streamed one ({text!r})")
        check(m and int(m.group(1)) == json.loads(body)["usage"]["completion_tokens"],
              "the tokens counted are the server's usage")
        check(not el("stop").is_enabled() and el("send").is_enabled(),
              "after the answer Stop is disabled and Send enabled")

        # A long answer, stopped: it stops growing, the server ends the
        # request, and the page takes the next message.
        el("system").send_keys("You are a storyteller.")
        el("max-tokens").clear()
        el("max-tokens").send_keys("1500")
        m0 = metrics(port)
        n_before = len(answers())
        answer = say("Tell me a very long story about a dragon and a lighthouse.")
        lengths = follow(answer, 60, stop_after=3)
        check(len(lengths) >= 3, f"the long answer grows before Stop ({lengths})")
        ready = wait_for("ui", lambda: not el("stop").is_enabled() and el("send").is_enabled(), 5)
        check(ready, "after Stop, Stop is disabled and Send enabled")
        at_stop = answer.find_element(By.CLASS_NAME, "text").text
        time.sleep(1.5)
        after = answer.find_element(By.CLASS_NAME, "text").text
        check(after == at_stop, f"the answer stops growing after Stop ({len(at_stop)} then "
              f"{len(after)} characters)")
        stats = answer.find_element(By.CLASS_NAME, "stats").text
        check(stats.startswith("stopped") and "tokens/s" in stats,
              f"a stopped answer says so, with its speed ({stats!r})")
        ended = wait_for("server", lambda: (lambda m: m["smol_requests_running"] == 0 and m)(
            metrics(port)), 10)
        check(ended and ended["smol_client_disconnects_total"] > m0["smol_client_disconnects_total"]
              and ended["smol_tokens_out_total"] - m0["smol_tokens_out_total"] < 1500,
              "the server ended the stopped request early, as a client that went away")

        el("max-tokens").clear()
        el("max-tokens").send_keys("48")
        n_before = len(answers())
        answer = say("Say hello.")
        check(answer, "after Stop the page takes the next message")
        follow(answer, 120)
        stats = answer.find_element(By.CLASS_NAME, "stats").text
        check(re.search(r"^\d+ tokens · [\d.]+ tokens/s", stats),
              f"the next answer completes with tokens/s ({stats!r})")

        sent = [s for s in driver.execute_script("return window.sent")
                if s["url"].endswith("chat/completions")]
        check(len(sent) == 3, f"the page sent three chat requests ({len(sent)})")
        if len(sent) == 3:
            first, long, last = (s["body"] for s in sent)
            check(all(s["auth"] == "Bearer " + KEY for s in sent),
                  "every request carries the key as a Bearer token")
            check(first["stream"] is True and first["temperature"] == 0
                  and first["max_tokens"] == 96 and first["model"] == model,
                  "the request is streamed, with the page's temperature, max tokens and model")
            check([m["role"] for m in long["messages"]] == ["system", "user", "assistant", "user"]
                  and long["messages"][0]["content"] == "You are a storyteller."
                  and long["messages"][2]["content"].strip() == text
                  and long["max_tokens"] == 1500,
                  "the second request carries the system prompt and the first turn")
            check([m["role"] for m in last["messages"]] ==
                  ["system", "user", "assistant", "user", "assistant", "user"]
                  and last["messages"][4]["content"].strip() == at_stop.strip()
                  and last["max_tokens"] == 48,
                  "the stopped answer stays in the conversation as far as it went")
    finally:
        if driver:
            driver.quit()
        proc.terminate()
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        check(rc == 0, f"smol-server exits 0 on SIGTERM ({rc})")
        if failures:
            log.seek(0)
            print(log.read()[-4000:])

    if failures:
        print(f"test-chat-page: FAIL: {len(failures)} check(s) failed")
        sys.exit(1)
    print("test-chat-page: OK")


main()
