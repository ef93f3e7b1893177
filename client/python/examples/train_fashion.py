#!/usr/bin/python3
"""A PyTorch trainer that keeps its state in tiermem and survives kill -9.

An MLP (784-256-128-10, Adam) on Fashion-MNIST (Debian's
dataset-fashion-mnist). After every --commit-every steps the parameters and
the optimizer's state are committed to a tiermem.torch.StateStore named
NAME.rankR; a process started again with the same name resumes at the last
committed step with exactly the state it had, and goes on to the same
parameters an uninterrupted run reaches (batches depend only on the seed and
the step; CPU, one thread).

torchrun's variables are honoured: RANK and WORLD_SIZE shard every batch over
the ranks (gradients averaged with torch.distributed, gloo, when WORLD_SIZE >
1: torchrun sets MASTER_ADDR/MASTER_PORT), LOCAL_RANK is printed; every rank
keeps its own store, and all resume at the newest step every rank still has.

    PYTHONPATH=build/client/python TIERMEM_SOCKET=/tmp/tiermem-cluster/node1/tiermemd.sock \\
        client/python/examples/train_fashion.py --steps 600
"""

import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np
import torch

import tiermem
import tiermem.torch

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def dataset(split: str, data_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = load_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    return x, torch.from_numpy(labels.astype(np.int64))


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def batch_indices(step: int, batch: int, n: int, seed: int) -> torch.Tensor:
    """The examples of global step `step`: epoch-wise permutations of the seed."""
    per_epoch = n // batch
    epoch, i = divmod(step, per_epoch)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)[i * batch:(i + 1) * batch]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", default=None, help="the daemon's socket (default: $TIERMEM_SOCKET)")
    p.add_argument("--name", default="fashion", help="store name prefix (NAME.rankR)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=1)
    p.add_argument("--tier", default="auto")
    p.add_argument("--replicas", type=int, default=0, help="copies of the state on other nodes")
    p.add_argument("--digests", action="store_true", help="print the parameters' digest at every commit")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--free", action="store_true", help="free the store at the end")
    p.add_argument("--data", default=DATA)
    args = p.parse_args()

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not 0 <= rank < world:
        print(f"train_fashion: RANK {rank} outside WORLD_SIZE {world}", file=sys.stderr)
        return 2
    if args.batch % world:
        print(f"train_fashion: --batch {args.batch} is not divisible by WORLD_SIZE {world}", file=sys.stderr)
        return 2
    distributed = world > 1
    if distributed:
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=rank, world_size=world)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    x_train, y_train = dataset("train", args.data)
    x_test, y_test = dataset("t10k", args.data)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    client = tiermem.connect(args.socket, name=f"train_fashion.rank{rank}")
    store = tiermem.torch.StateStore(client, f"{args.name}.rank{rank}", tier=args.tier, replicas=args.replicas)
    start = 0
    if store.commits():
        want = None
        if distributed:  # the newest step every rank still holds
            steps = store.steps()
            t = torch.tensor([steps[0]], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            want = int(t.item())
        start = store.resume(model, optimizer, step=want)
        print(f"rank {rank}: resumed at step {start} digest {digest(model)} from {store.gva}", flush=True)
    else:
        print(f"rank {rank}/{world} (local rank {local_rank}): starting at step 0, store {args.name}.rank{rank}",
              flush=True)
    if start >= args.steps:
        print(f"rank {rank}: already at step {start} of {args.steps}: nothing to train", flush=True)

    began = time.monotonic()
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        idx = batch_indices(step, args.batch, len(x_train), args.seed)
        share = args.batch // world
        idx = idx[rank * share:(rank + 1) * share]
        optimizer.zero_grad()
        loss = loss_fn(model(x_train[idx]), y_train[idx])
        loss.backward()
        if distributed:
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
        optimizer.step()
        done = step + 1
        if done % args.commit_every == 0 or done == args.steps:
            store.commit_training(done, model, optimizer)
            if args.digests:
                print(f"rank {rank}: step {done} committed loss {loss.item():.6f} digest {digest(model)}", flush=True)
        if done % args.log_every == 0:
            rate = (done - start) / max(time.monotonic() - began, 1e-9)
            print(f"rank {rank}: step {done}/{args.steps} loss {loss.item():.4f} ({rate:.0f} steps/s)", flush=True)

    with torch.no_grad():
        accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
    print(f"rank {rank}: done at step {max(start, args.steps)} digest {digest(model)} "
          f"test accuracy {100 * accuracy:.2f} %", flush=True)
    if args.free:
        store.free()
    else:
        store.close()
    client.close()
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
