"""The checks the Python tests of smol-server share: each prints ok or FAIL
with the seconds since the test started, and failures collects what
failed for the summary."""

import time

failures = []
T0 = time.time()


def check(cond, what):
    print(f"  {'ok  ' if cond else 'FAIL'} {time.time() - T0:5.1f}s  {what}", flush=True)
    if not cond:
        failures.append(what)
    return cond
