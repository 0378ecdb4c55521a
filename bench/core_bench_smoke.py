#!/usr/bin/env python3
"""Smoke run of core_bench: every case, a few thousand calls, and a check of
its output's shape -- one key=value line per case and outstanding count,
every field there and numeric, every call completed.  Never a speed.

usage: core_bench_smoke.py CORE_BENCH
"""
import subprocess
import sys

CALLS = 3000
OUTSTANDING = [1, 8]
# (case, outstanding, unit) of every line expected, in order.
EXPECTED = ([("unary64", o, "calls") for o in OUTSTANDING] +
            [("packed64", o, "calls") for o in OUTSTANDING if o > 1] +
            [("stream64", 1, "messages")])


def fail(msg):
    print("core_bench_smoke: FAIL: " + msg)
    sys.exit(1)


def fields_for(unit):
    per = "call" if unit == "calls" else "message"
    return ["case", "outstanding", unit, "failed", "cpu_ns", "wall_ns", unit + "_per_s",
            "cpu_ns_per_" + per, "turns_per_" + per]


def main():
    cmd = [sys.argv[1], "--calls", str(CALLS), "--warmup", "100",
           "--outstanding", ",".join(str(o) for o in OUTSTANDING)]
    print("core_bench_smoke: " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, timeout=120, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        fail("core_bench exited with %d" % r.returncode)
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    if len(lines) != len(EXPECTED):
        fail("%d lines, expected %d (%s)" % (len(lines), len(EXPECTED), EXPECTED))
    for line, (case, outstanding, unit) in zip(lines, EXPECTED):
        kv = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if not eq or not key or not value:
                fail("not key=value: %r in %r" % (token, line))
            if key in kv:
                fail("key %s twice in %r" % (key, line))
            kv[key] = value
        for f in fields_for(unit):
            if f not in kv:
                fail("no %s in %r" % (f, line))
        if kv["case"] != case or int(kv["outstanding"]) != outstanding:
            fail("expected case=%s outstanding=%d, got %r" % (case, outstanding, line))
        for k, v in kv.items():
            if k == "case":
                continue
            try:
                x = float(v)
            except ValueError:
                fail("%s=%r is not a number in %r" % (k, v, line))
            if x < 0:
                fail("%s=%s is negative in %r" % (k, v, line))
        if int(kv[unit]) != CALLS or int(kv["failed"]) != 0:
            fail("%s=%s failed=%s, expected %d and 0: %r" % (unit, kv[unit], kv["failed"], CALLS, line))
        if int(kv["cpu_ns"]) <= 0 or int(kv["wall_ns"]) <= 0:
            fail("no time measured: %r" % line)
        if case == "packed64" and int(kv.get("packs", "0")) <= 0:
            fail("the packed case sent no PACK: %r" % line)
    print("core_bench_smoke: OK, %d cases" % len(lines))


if __name__ == "__main__":
    main()
