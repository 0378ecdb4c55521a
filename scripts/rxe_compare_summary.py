#!/usr/bin/env python3
"""Summary of one scripts/rxe_compare.sh run: reads the raw output it left in
DIR (perftest-*.out, ucx-*.out, slotrpc-bB-rR-SIZE.out, *.ctr counter deltas,
builds.txt) and prints the comparison table.

    python3 scripts/rxe_compare_summary.py DIR [--json FILE]

Exits 1 when a phase's output is missing or unreadable, naming it.
"""
import json
import os
import re
import statistics
import sys

RETRANSMIT = ("completer_retry_err", "duplicate_request")


def die(msg):
    print(f"rxe_compare_summary: {msg}", file=sys.stderr)
    sys.exit(1)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")


def counters(d, name):
    """The phase's counter deltas and message count, from NAME.ctr."""
    out = {}
    for line in read(os.path.join(d, name + ".ctr")).splitlines():
        k, _, v = line.partition(" ")
        out[k] = int(v)
    return out


def perftest_typical_us(d, size):
    text = read(os.path.join(d, f"perftest-{size}.out")).splitlines()
    for i, line in enumerate(text):
        if line.strip().startswith("#bytes") and i + 1 < len(text):
            f = text[i + 1].split()
            typical = float(f[4])
            mhz_file = os.path.join(d, f"perftest-{size}.mhz")
            if os.path.exists(mhz_file):
                typical /= float(read(mhz_file))  # cycles -> us
            return typical
    die(f"perftest-{size}.out has no result line")


def ucx_final(d, name):
    """ucx_perftest's 'Final:' row: iterations, p50, avg, overall latency (us,
    one way), bandwidth avg/overall (MB/s), message rate avg/overall."""
    for line in read(os.path.join(d, name + ".out")).splitlines():
        if line.strip().startswith("Final:"):
            return [float(x) for x in line.split()[1:]]
    die(f"{name}.out has no 'Final:' row")


def per_message(c):
    m = c.get("messages", 0) or 1
    return {k: c.get(k, 0) / m for k in RETRANSMIT}


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        die("usage: rxe_compare_summary.py DIR [--json FILE]")
    d = args[0]
    json_out = args[2] if len(args) >= 3 and args[1] == "--json" else None
    builds = read(os.path.join(d, "builds.txt")).split()
    res = {"builds": builds, "floor": {}, "ucx": {}, "slotrpc": {}, "retransmits": {}}

    for s in (64, 4096):
        res["floor"][s] = 2 * perftest_typical_us(d, s)
        res["retransmits"][f"perftest {s} B"] = per_message(counters(d, f"perftest-{s}"))
    for s in (64, 4096, 61440):
        res["ucx"][s] = 2 * ucx_final(d, f"ucx-lat-{s}")[1]
        res["retransmits"][f"ucx am_lat {s} B"] = per_message(counters(d, f"ucx-lat-{s}"))
    ucx_rate = {}
    for s in (64, 4096):
        ucx_rate[s] = ucx_final(d, f"ucx-bw-{s}")[-1]
        res["retransmits"][f"ucx am_bw {s} B"] = per_message(counters(d, f"ucx-bw-{s}"))

    pat = re.compile(r"slotrpc-b(\d+)-r(\d+)-(\d+)\.out$")
    points = {}  # (build, size, outstanding) -> [(p50, rate)]
    ctrs = {}  # (build, size) -> summed counters
    for name in sorted(os.listdir(d)):
        m = pat.match(name)
        if not m:
            continue
        b, size = int(m.group(1)), int(m.group(3))
        for line in read(os.path.join(d, name)).splitlines():
            f = line.split()
            if len(f) == 6 and f[0].isdigit():
                points.setdefault((b, int(f[0]), int(f[1])), []).append((float(f[2]), float(f[5])))
        c = counters(d, name[:-4])
        acc = ctrs.setdefault((b, size), {})
        for k, v in c.items():
            acc[k] = acc.get(k, 0) + v
    if not points:
        die(f"no slotrpc results in {d}")

    print("Soft-RoCE rxe0 in qemu TCG; one boot; round trips in us (medians over rounds)")
    print("floor = 2 x ib_send_lat typical; UCX = 2 x ucp_am_lat p50 (UCX_TLS=rc_v)")
    for s in (64, 4096):
        print(f"  floor {s:>5} B: {res['floor'][s]:8.1f} us   UCX am_lat: {res['ucx'][s]:8.1f} us"
              f"   UCX am_bw: {ucx_rate[s]:9.0f} msg/s")
    print(f"  UCX am_lat 61440 B: {res['ucx'][61440]:8.1f} us")
    print()
    print(f"{'build':<6}{'size':>7}{'out':>5}{'p50 us':>10}{'calls/s':>10}{'x floor':>9}{'x UCX':>8}  rounds")
    for (b, size, w) in sorted(points):
        v = points[(b, size, w)]
        p50 = statistics.median(x[0] for x in v)
        rate = statistics.median(x[1] for x in v)
        floor = res["floor"].get(size)
        ucx = res["ucx"].get(size)
        res["slotrpc"][f"b{b} {size} {w}"] = {"p50_us": p50, "calls_per_s": rate,
                                              "p50_all": [x[0] for x in v], "rate_all": [x[1] for x in v]}
        fx = f"{p50 / floor:9.2f}" if floor and w == 1 else f"{'':>9}"
        ux = f"{p50 / ucx:8.2f}" if ucx and w == 1 else f"{'':>8}"
        allp = " ".join(f"{x[0]:.1f}/{x[1]:.0f}" for x in v)
        print(f"b{b:<5}{size:>7}{w:>5}{p50:>10.1f}{rate:>10.0f}{fx}{ux}  {allp}")
    print()
    print("retransmits per message sent (completer_retry_err, duplicate_request):")
    for k, v in res["retransmits"].items():
        print(f"  {k:<24} {v['completer_retry_err']:.5f}  {v['duplicate_request']:.5f}")
    for (b, size), c in sorted(ctrs.items()):
        pm = per_message(c)
        res["retransmits"][f"slotrpc b{b} {size} B"] = pm
        print(f"  {'slotrpc b%d %d B' % (b, size):<24} {pm['completer_retry_err']:.5f}  "
              f"{pm['duplicate_request']:.5f}   ({c.get('completer_retry_err', 0)} retries, "
              f"{c.get('duplicate_request', 0)} duplicates in {c.get('messages', 0)} messages)")
    print()
    for i, b in enumerate(builds):
        print(f"b{i} = {b}")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
