#!/usr/bin/env python3
"""The executor's runtime is layered (docs/ARCHITECTURE.md, "The runtime's
parts"): options and env at the bottom, then plan, state, exchange, step and
control. A file of one layer includes only files of its own layer or below;
this fails naming every include that points up."""
import os
import re
import sys

ORDER = {"": 0, "plan": 1, "state": 2, "exchange": 3, "step": 4, "control": 5}


def main(root):
    runtime = os.path.join(root, "executor", "runtime")
    upward = []
    seen = 0
    for layer, rank in ORDER.items():
        folder = os.path.join(runtime, layer) if layer else runtime
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            seen += 1
            for inc in re.findall(r'#include "executor/runtime/([a-z_/]+)\.hpp"', open(path).read()):
                target = inc.split("/")[0] if "/" in inc else ""
                if target not in ORDER:
                    upward.append(f"{layer}/{name} includes {inc}.hpp, in no layer")
                elif ORDER[target] > rank:
                    upward.append(f"{layer or '.'}/{name} ({layer or 'bottom'}) includes {inc}.hpp ({target})")
    for line in upward:
        print(line)
    print(f"{seen} files, {len(upward)} includes pointing up")
    return 1 if upward or seen == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
