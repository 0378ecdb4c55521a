#!/usr/bin/env python3
"""Where core_bench's instructions go: reads one callgrind dump of one case
(core_bench writes one per measured case under callgrind) and prints
instructions (Ir) per call by part of the call path, for the table in
docs/benchmarks.md, "Cost of a call (core)".

    valgrind --tool=callgrind build-h/bench/core_bench --calls 20000 --warmup 2000
    bench/core_bench_profile.py callgrind.out.<pid>.1 --calls 20000

Each function's own instructions (callgrind's exclusive cost) go to the
part its name says (the PARTS patterns below, first match wins).  A function
no pattern names -- FlatBuffers' builder, memcpy, std::string, Status -- is
charged to its callers in proportion to what each call cost, up to the
first caller a pattern names: a memcpy inside the link counts for the link,
the builder inside the handler for the handler.  Allocation, clock reads
and metrics have parts of their own wherever they are called from.
--sides sums the same by side (client, server, loop and link), each shared
helper charged to the side that called it.  --callers NAME lists who calls
a function and how often per call.
"""
import argparse
import re
import sys
from collections import defaultdict

# (part, regex on the function name), first match wins.
PARTS = [
    ("allocation (malloc/free/new/delete)", r"^(malloc|free|_int_free|_int_malloc|operator new|operator delete|"
                                            r"cfree|tcache|malloc_consolidate|unlink_chunk)"),
    ("clock reads", r"(steady_clock::now|clock_gettime|__vdso)"),
    ("metrics (counters, histograms)", r"(count_finished|count_bulk|Histogram::|MethodCounters|_Map_base<unsigned int, std::pair<unsigned int const, slotrpc::core::MethodCounters)"),
    ("fiber start and switch", r"(FiberPool::|jump_fcontext|ontop_fcontext|fiber_entry|fiber_record|base::Fiber)"),
    ("server: request verifier (FlatBuffers)", r"ServiceDefinition::verify_as"),
    ("client: reply verifier (Reply<T>)", r"slotrpc::Reply<"),
    ("wire header encode/decode/validate", r"slotrpc::core::(encode_header|decode_header|validate_header|control_header)"),
    ("server: handler (Echo, builds the reply)", r"(EchoHandler::|add_typed_unary|ReplyBuilder)"),
    ("application: request writer, reply sink", r"(anon.*Bench|\(anonymous namespace\)::Bench|Bench::Run)"),
    ("server: dispatch, reply, slot state", r"slotrpc::core::ServerSession\b|ServerCall"),
    ("client: submit, send, reply, slot state", r"slotrpc::core::ClientSession\b|slotrpc::core::PendingCall|release_reply|slotrpc::RawReply::|slotrpc::core::Outbox|slotrpc::core::SlotBuilder"),
    ("memory link (post, copy, completion queue)", r"slotrpc::transport::memory::"),
    ("reactor turn (poll loop, tasks, timers)", r"(slotrpc::reactor::Reactor::|slotrpc::core::Loop::|TimerHeap|MpscQueue)"),
]
PARTS = [(name, re.compile(rx)) for name, rx in PARTS]
# --sides: the same walk, by side.  Shared helpers (allocation, clocks,
# metrics, headers, FlatBuffers) go to the side whose code called them.
SIDES = [
    ("loop and link (reactor turn, fibers, memory link)",
     r"(slotrpc::reactor::|slotrpc::core::Loop::|TimerHeap|MpscQueue|slotrpc::transport::memory::|"
     r"FiberPool::|jump_fcontext|ontop_fcontext|fiber_entry|fiber_record)"),
    ("server side (dispatch, verifier, handler, reply)",
     r"(slotrpc::core::ServerSession\b|ServerCall|EchoHandler::|add_typed_unary|ServiceDefinition::verify_as|ReplyBuilder)"),
    ("client side (submit, writer, reply, verifier, sink)",
     r"(slotrpc::core::ClientSession\b|slotrpc::core::PendingCall|release_reply|slotrpc::RawReply::|slotrpc::Reply<|"
     r"anon.*Bench|\(anonymous namespace\)::Bench|Bench::Run)"),
]
SIDES = [(name, re.compile(rx)) for name, rx in SIDES]
UNCHARGED = "other (no caller named)"


def parse(path):
    """self[fn] = Ir; arcs[(caller, callee)] = [count, inclusive Ir]."""
    names = {}
    self_cost = defaultdict(int)
    arcs = defaultdict(lambda: [0, 0])
    fn = None
    pending_call = None  # (callee, count): the next cost line is the call's inclusive cost
    cfn = None
    events = None

    def name_of(spec):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?$", spec)
        if not m:
            return spec
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), spec)

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            if line.startswith("events:"):
                events = line.split()[1:]
                continue
            if line.startswith("fn="):
                fn = name_of(line[3:])
                continue
            if line.startswith("cfn="):
                cfn = name_of(line[4:])
                continue
            if line.startswith("calls="):
                pending_call = (cfn, int(line[6:].split()[0]))
                continue
            if line[0].isdigit() or line[0] in "+-*":
                parts = line.split()
                ir = int(parts[1]) if len(parts) > 1 else 0
                if pending_call is not None:
                    a = arcs[(fn, pending_call[0])]
                    a[0] += pending_call[1]
                    a[1] += ir
                    pending_call = None
                elif fn is not None:
                    self_cost[fn] += ir
                continue
            # fl=, fi=, fe=, ob=, cob=, cfi=, cfl=, summary:, totals: ... ignored
    if events is not None and events[0] != "Ir":
        sys.exit("core_bench_profile: the dump's first event is %s, not Ir" % events[0])
    return self_cost, arcs


def part_of(fn, parts=None):
    for name, rx in parts or PARTS:
        if rx.search(fn):
            return name
    return None


def attribute(self_cost, arcs, parts=None):
    callers = defaultdict(list)  # callee -> [(caller, inclusive)]
    for (caller, callee), (_, incl) in arcs.items():
        if caller != callee:
            callers[callee].append((caller, incl))
    out = defaultdict(float)

    def charge(fn, amount, depth, seen):
        part = part_of(fn, parts)
        if part is not None:
            out[part] += amount
            return
        ins = [(c, w) for c, w in callers.get(fn, []) if w > 0 and c not in seen]
        total = sum(w for _, w in ins)
        if depth > 40 or total == 0:
            out[UNCHARGED] += amount
            return
        for c, w in ins:
            charge(c, amount * w / total, depth + 1, seen | {fn})

    for fn, cost in self_cost.items():
        if cost:
            charge(fn, float(cost), 0, frozenset())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    ap.add_argument("--calls", type=int, required=True, help="calls (messages) in the case")
    ap.add_argument("--callers", help="a function name (substring): who calls it, per call")
    ap.add_argument("--sides", action="store_true", help="by side (client, server, loop) instead of by part")
    args = ap.parse_args()
    self_cost, arcs = parse(args.dump)
    n = args.calls
    if args.callers:
        rows = [(caller, c, incl) for (caller, callee), (c, incl) in arcs.items() if args.callers in callee]
        for caller, c, incl in sorted(rows, key=lambda r: -r[1]):
            print("%8.2f calls/call %8.1f Ir/call  %s" % (c / n, incl / n, caller[:150]))
        return
    parts = attribute(self_cost, arcs, SIDES if args.sides else None)
    total = sum(self_cost.values())
    print("| part of the call path | Ir per call | share |")
    print("|---|---:|---:|")
    for name, ir in sorted(parts.items(), key=lambda kv: -kv[1]):
        if ir < 0.5 * n:
            continue  # nothing, or under half an instruction per call
        print("| %s | %.0f | %.1f %% |" % (name, ir / n, 100.0 * ir / total))
    print("| **total** | **%.0f** | 100 %% |" % (total / n))


if __name__ == "__main__":
    main()
