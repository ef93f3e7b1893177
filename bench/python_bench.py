"""Python against C++ (bench/python.sh): 64 MiB written and read from Python
through the tiermem module into a DRAM tier mapped in this process, medians
of 15 round-robin reps, and what a zero-copy view costs to make. The C++
client's figures of the same copies (build/bench/local_copy_bench, same
daemon configuration) come in as arguments; ratios are Python / C++."""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "python"))
from conftest import Daemon  # noqa: E402  (a real tiermemd, as the python suite starts it)

SIZE = 64 << 20
REPS = 15


def figure(name, value, unit):
    print(f"{name} {value:.4g} {unit}", flush=True)


def ratio(name, value):
    print(f"{name}_ratio {value:.3f}", flush=True)


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cxx-write", type=float, required=True, help="client_write_64MiB_bandwidth, GB/s")
    p.add_argument("--cxx-read", type=float, required=True, help="client_read_64MiB_bandwidth, GB/s")
    args = p.parse_args()
    daemon = Daemon(dram="256MiB", pmem="8MiB", page_size="2MiB")
    try:
        with daemon.connect(name="python_bench") as client:
            a = client.alloc(SIZE, tier="dram", strict=True)
            src = torch.randint(0, 2**31 - 1, (SIZE // 4,), dtype=torch.int32)
            dst = torch.zeros_like(src)
            src_np = src.numpy()
            client.write(a, src)
            client.read_into(a, dst)  # first touch of the tier's pages, not timed
            assert torch.equal(src, dst)
            t = {"write_tensor": [], "read_into_tensor": [], "write_numpy": [], "read_bytes": []}
            ops = {
                "write_tensor": lambda: client.write(a, src),
                "read_into_tensor": lambda: client.read_into(a, dst),
                "write_numpy": lambda: client.write(a, src_np),
                "read_bytes": lambda: client.read(a, SIZE),
            }
            for _ in range(REPS):
                for name, op in ops.items():
                    start = time.perf_counter()
                    op()
                    t[name].append(time.perf_counter() - start)
            gb = SIZE / 1e9
            print(f"# 64 MiB copies from Python, median of {REPS}; baseline: the C++ client in "
                  f"local_copy_bench (write {args.cxx_write} GB/s, read {args.cxx_read} GB/s)")
            bw = {k: gb / median(v) for k, v in t.items()}
            figure("python_write_tensor_64MiB_bandwidth", bw["write_tensor"], "GB/s")
            figure("python_write_numpy_64MiB_bandwidth", bw["write_numpy"], "GB/s")
            figure("python_read_into_tensor_64MiB_bandwidth", bw["read_into_tensor"], "GB/s")
            figure("python_read_bytes_64MiB_bandwidth", bw["read_bytes"], "GB/s")
            ratio("python_write_vs_cxx", bw["write_tensor"] / args.cxx_write)
            ratio("python_read_vs_cxx", bw["read_into_tensor"] / args.cxx_read)

            with client.map(a) as m:
                views = 2000
                for label, make in (("torch_from_dlpack_map", lambda: torch.from_dlpack(m)),
                                    ("numpy_asarray_map", lambda: np.asarray(m))):
                    samples = []
                    for _ in range(views):
                        start = time.perf_counter()
                        v = make()
                        samples.append(time.perf_counter() - start)
                        del v
                    figure(label + "_creation", median(samples) * 1e6, "us")
                start = time.perf_counter()
                for _ in range(200):
                    mm = client.map(a)
                    mm.close()
                figure("map_unmap", (time.perf_counter() - start) / 200 * 1e6, "us")
            a.free()
    finally:
        daemon.close()


if __name__ == "__main__":
    main()
