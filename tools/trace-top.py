#!/usr/bin/env python3
"""Sums a tiermem-exec trace (--trace) up by op: where a step's time goes.

    tools/trace-top.py TRACE [--steps-from N] [--top K] [--json]

Ops of every layer are counted together (the digits of a name become '#':
'h.3.mlp.c_fc' and 'h.5.mlp.c_fc' are 'h.#.mlp.c_fc'). The first steps
(--steps-from, default 3: warm-up, autotuning) are left out. On a GPU the
spans are the kernels' time only when the run had --no-graphs (each op then
waits for its kernels); a replayed step's spans are its launches.
"""
import argparse
import json
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps-from", type=int, default=3, help="leave out the steps before this one (by 'optimizer' spans)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    try:
        events = json.load(open(a.trace))["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"trace-top: cannot read {a.trace}: {e}")
    spans = sorted((e for e in events if e.get("ph") == "X"), key=lambda e: e["ts"])
    # A step ends with its optimizer span; spans after the last one (an
    # evaluation, the final commit) belong to no step.
    step, total, pending, steps = 0, {}, [], set()
    for e in spans:
        if step >= a.steps_from:
            pending.append(e)
        if e["name"] == "optimizer":
            for p in pending:
                t = total.setdefault((p["cat"], re.sub(r"\d+", "#", p["name"])), [0.0, 0])
                t[0] += p["dur"]
                t[1] += 1
            if pending:
                steps.add(step)
            pending = []
            step += 1
    n = max(len(steps), 1)
    rows = sorted(((v[0] / n / 1e3, v[1] / n, k[0], k[1]) for k, v in total.items()), reverse=True)
    whole = sum(r[0] for r in rows)
    if a.json:
        print(json.dumps({"steps": len(steps), "ms_per_step": whole,
                          "ops": [{"name": r[3], "kind": r[2], "ms": r[0], "calls": r[1]} for r in rows]}))
        return
    print(f"{len(steps)} steps from step {a.steps_from}: {whole:.3f} ms a step in spans")
    print(f"{'ms/step':>9} {'share':>6} {'calls':>6}  op")
    for ms, calls, cat, name in rows[:a.top]:
        print(f"{ms:9.3f} {100 * ms / whole if whole else 0:5.1f}% {calls:6.1f}  {name}{'' if cat == 'compute' else ' (' + cat + ')'}")
    if len(rows) > a.top:
        rest = sum(r[0] for r in rows[a.top:])
        print(f"{rest:9.3f} {100 * rest / whole if whole else 0:5.1f}%         {len(rows) - a.top} more")


if __name__ == "__main__":
    main()
