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
