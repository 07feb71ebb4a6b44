"""What the Python CTests share: a check that records a failure and goes on (so that one run
lists every failed check), and the exit that fails the test when any did."""
import sys

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return ok


def finish(name):
    if failures:
        print(f"{len(failures)} failed checks", flush=True)
        sys.exit(1)
    print(f"{name}: all checks passed")
