#!/usr/bin/env python3
"""CI smoke run of slotrpc-bench: every mode over every system
of this build, a handful of calls each, --json; checks the JSON parses and
holds every expected row and field.  Never a speed: only that the benchmark
still runs, completes its calls and reports them.

usage: smoke_test.py SLOTRPC_BENCH [--grpc]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

FIELDS = ["mode", "system", "size", "outstanding", "channels", "calls", "failed", "p50_us", "p99_us",
          "p999_us", "mean_us", "max_us", "calls_per_s", "mb_per_s", "ratio_to_grpc", "ratio_to_limit"]


def fail(msg):
    print("smoke_test: FAIL: " + msg)
    sys.exit(1)


def main():
    bench = sys.argv[1]
    with_grpc = "--grpc" in sys.argv[2:]
    slotrpc_systems = ["tcp", "shm"]
    systems = slotrpc_systems + ["socket"] + (["grpc"] if with_grpc else [])
    calls, tcalls = 20, 60
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        cmd = [bench, "--modes", "latency,throughput", "--transports", ",".join(systems),
               "--sizes", "64,4096,max", "--slot-size", "65536", "--warmup", "3", "--calls", str(calls),
               "--throughput-calls", str(tcalls), "--outstanding", "1,8", "--channels", "1,2",
               "--json", out]
        print("smoke_test: " + " ".join(cmd), flush=True)
        env = dict(os.environ)
        env.pop("SLOTRPC_TRANSPORT", None)
        r = subprocess.run(cmd, env=env, timeout=150, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        print(r.stdout)
        if r.returncode != 0:
            fail("slotrpc-bench exited %d" % r.returncode)
        with open(out) as f:
            doc = json.load(f)

    if doc.get("tool") != "slotrpc-bench" or doc.get("format") != 1:
        fail("tool/format missing")
    for k in ["cpu", "hardware_threads", "kernel", "loadavg"]:
        if k not in doc.get("machine", {}):
            fail("machine." + k + " missing")
    largest = int(doc["run"]["largest_payload"])
    if not 60000 < largest < 65536 - 32:
        fail("largest_payload %d is not just under the 64 KiB slot" % largest)
    rows = doc["results"]
    for row in rows:
        for k in FIELDS:
            if k not in row:
                fail("field %s missing in %r" % (k, row))
        for k in FIELDS[7:14]:
            if not isinstance(row[k], (int, float)) or not math.isfinite(row[k]) or row[k] < 0:
                fail("%s is not a non-negative number in %r" % (k, row))
        if row["failed"] != 0:
            fail("failed calls in %r" % row)
        if row["p50_us"] <= 0 or row["calls_per_s"] <= 0 or row["max_us"] < row["p50_us"]:
            fail("implausible figures in %r" % row)

    def find(mode, system, size, outstanding=1, channels=1):
        got = [r for r in rows if (r["mode"], r["system"], r["size"], r["outstanding"], r["channels"]) ==
               (mode, system, size, outstanding, channels)]
        if len(got) != 1:
            fail("expected one %s row for %s size %d outstanding %d channels %d, found %d" %
                 (mode, system, size, outstanding, channels, len(got)))
        return got[0]

    names = ["slotrpc-" + s for s in slotrpc_systems] + ["socket"] + (["grpc"] if with_grpc else [])
    for name in names:
        for size in [64, 4096, largest]:
            row = find("latency", name, size)
            if row["calls"] != calls:
                fail("latency row counts %d calls, not %d" % (row["calls"], calls))
            if name.startswith("slotrpc-"):
                if not row["ratio_to_limit"] or row["ratio_to_limit"] <= 0:
                    fail("no ratio to the socket limit in %r" % row)
                if with_grpc and (not row["ratio_to_grpc"] or row["ratio_to_grpc"] <= 0):
                    fail("no ratio to gRPC in %r" % row)
        if name == "socket":
            continue
        for ch in [1, 2]:
            for k in [1, 8]:
                row = find("throughput", name, 64, k, ch)
                if row["calls"] != tcalls:
                    fail("throughput row counts %d calls, not %d" % (row["calls"], tcalls))
                if with_grpc and name.startswith("slotrpc-") and not row["ratio_to_grpc"]:
                    fail("no ratio to gRPC in %r" % row)
    expected = len(names) * 3 + (len(names) - 1) * 4
    if len(rows) != expected:
        fail("%d rows, expected %d" % (len(rows), expected))
    print("smoke_test: OK, %d rows" % len(rows))
    bulk_smoke(bench)


def bulk_smoke(bench):
    """The bulk modes over TCP and shared memory beside the
    socket ping-pong and one-way transfers: every row present, every call
    completed (each checks the bytes it got), the ratio to the limit filled
    in."""
    sizes, calls = [4096, 1 << 20], 3
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bulk.json")
        cmd = [bench, "--modes", "bulk,bulk-read,bulk-write,bulk-load", "--transports", "socket,bulk-tcp,bulk-shm",
               "--bulk-sizes", ",".join(map(str, sizes)), "--bulk-calls", str(calls),
               "--load-size", str(8 << 20), "--load-idle-calls", "20", "--json", out]
        print("smoke_test: " + " ".join(cmd), flush=True)
        env = dict(os.environ)
        env.pop("SLOTRPC_TRANSPORT", None)
        r = subprocess.run(cmd, env=env, timeout=150, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        print(r.stdout)
        if r.returncode != 0:
            fail("slotrpc-bench (bulk modes) exited %d" % r.returncode)
        with open(out) as f:
            rows = json.load(f)["results"]
    for row in rows:
        if row["failed"] != 0:
            fail("failed calls in %r" % row)
    def one(mode, system, size):
        got = [r for r in rows if (r["mode"], r["system"], r["size"]) == (mode, system, size)]
        if len(got) != 1:
            fail("expected one %s row for %s size %d, found %d" % (mode, system, size, len(got)))
        return got[0]
    for size in sizes:
        for mode in ["bulk", "bulk-read", "bulk-write"]:
            for system in ["slotrpc-bulk-tcp", "slotrpc-bulk-shm", "socket"]:
                row = one(mode, system, size)
                if row["calls"] != calls or row["p50_us"] <= 0 or row["mb_per_s"] <= 0:
                    fail("implausible figures in %r" % row)
            # bulk: the ping-pong's; bulk-read / bulk-write: a one-way transfer's.
            for system in ["slotrpc-bulk-tcp", "slotrpc-bulk-shm"]:
                if not one(mode, system, size)["ratio_to_limit"]:
                    fail("no ratio to the socket's %s at %d bytes for %s" % (mode, size, system))
    for system in ["slotrpc-bulk-tcp", "slotrpc-bulk-shm"]:
        idle = one("bulk-load", system + " idle", 8 << 20)
        during = one("bulk-load", system + " during", 8 << 20)
        # How many small calls fit inside the 8 MiB echo depends on the
        # machine (possibly none): only that both rows exist and the idle
        # ones all ran.
        if idle["calls"] != 20 or during["failed"] != 0:
            fail("implausible bulk-load rows %r %r" % (idle, during))
    print("smoke_test: bulk modes OK, %d rows" % len(rows))


if __name__ == "__main__":
    main()
