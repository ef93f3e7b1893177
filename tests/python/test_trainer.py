"""The example PyTorch trainer (client/python/examples/train_fashion.py) keeps
its parameters and Adam's state in tiermem: killed with SIGKILL mid-epoch and
started again, it resumes at the last committed step with exactly the
parameters an uninterrupted run had at that step, and ends where that run
ends."""

import os
import re
import signal
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "client", "python", "examples", "train_fashion.py")
STEPS = 80


def trainer(daemon, name, *extra):
    return subprocess.Popen([sys.executable, EXAMPLE, "--socket", daemon.socket, "--name", name, "--steps",
                             str(STEPS), "--digests", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def digests(lines):
    return {int(m[1]): m[2] for m in (re.search(r"step (\d+) committed .* digest (\w+)", l) for l in lines) if m}


def final_digest(lines):
    return next(m[1] for m in (re.search(r"done at step \d+ digest (\w+)", l) for l in lines) if m)


def test_a_killed_trainer_resumes_at_the_committed_step_with_the_same_parameters(daemon):
    ref = trainer(daemon, "reference")
    ref_out, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, ref_out
    ref_lines = ref_out.splitlines()
    ref_digests = digests(ref_lines)
    assert sorted(ref_digests) == list(range(1, STEPS + 1)), ref_out

    victim = trainer(daemon, "victim")
    seen = []
    for line in victim.stdout:
        seen.append(line)
        m = re.search(r"step (\d+) committed", line)
        if m and int(m[1]) >= 30:
            victim.send_signal(signal.SIGKILL)  # mid-epoch (937 steps an epoch), at any instruction
            break
    victim.wait(60)
    assert victim.returncode == -signal.SIGKILL, "".join(seen)
    killed_at = max(digests(seen))

    again = trainer(daemon, "victim")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    lines = out.splitlines()
    resumed = next(re.search(r"resumed at step (\d+) digest (\w+)", l) for l in lines if "resumed" in l)
    step = int(resumed[1])
    # The last commit it printed, or the one after (killed between commit and print).
    assert killed_at <= step <= killed_at + 1, out
    assert resumed[2] == ref_digests[step], out
    assert final_digest(lines) == final_digest(ref_lines)
    # Nothing trained twice: every step after the resumed one was committed once, as in the reference.
    assert digests(lines) == {k: v for k, v in ref_digests.items() if k > step}


def test_a_finished_run_started_again_trains_nothing(daemon):
    first = trainer(daemon, "finished")
    first.communicate(timeout=300)
    assert first.returncode == 0
    second = trainer(daemon, "finished")
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    assert f"resumed at step {STEPS}" in out and "nothing to train" in out


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(daemon, name, steps):
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, EXAMPLE, "--socket", daemon.socket, "--name", name, "--steps",
                                       str(steps), "--digests"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def test_torchrun_ranks_resume_together_at_a_step_both_committed(daemon):
    steps = 40
    ref = two_ranks(daemon, "ddp-reference", steps)
    ref_out = [p.communicate(timeout=300)[0] for p in ref]
    assert all(p.returncode == 0 for p in ref), ref_out
    ref_digests = [digests(o.splitlines()) for o in ref_out]
    assert ref_digests[0] == ref_digests[1]  # data parallel: the same parameters on both
    ref_final = final_digest(ref_out[0].splitlines())

    victims = two_ranks(daemon, "ddp-victim", steps)
    for line in victims[0].stdout:
        m = re.search(r"step (\d+) committed", line)
        if m and int(m[1]) >= 15:
            break
    for p in victims:
        p.send_signal(signal.SIGKILL)
    for p in victims:
        p.wait(60)

    again = two_ranks(daemon, "ddp-victim", steps)
    outs = [p.communicate(timeout=300)[0] for p in again]
    assert all(p.returncode == 0 for p in again), outs
    resumed = [re.search(r"resumed at step (\d+) digest (\w+)", o) for o in outs]
    assert all(resumed), outs
    step = int(resumed[0][1])
    # Rank 0 had committed 15; rank 1 at least 14 (its all-reduce of step 15
    # came before rank 0's commit of it): both resume at the older one.
    assert int(resumed[1][1]) == step >= 14, outs
    assert resumed[0][2] == resumed[1][2] == ref_digests[0][step], outs
    assert final_digest(outs[0].splitlines()) == final_digest(outs[1].splitlines()) == ref_final
