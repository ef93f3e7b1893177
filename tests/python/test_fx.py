"""tiermem.fx: a GPT written in PyTorch (tests/executor/gpt_torch.py) is
exported, trained by tiermem-exec from the module's own parameters, and its
losses are those of the same module trained by PyTorch on the same batches;
what the IR cannot express is refused by name and line."""

import copy
import os
import subprocess
import sys

import numpy
import pytest
import torch

import tiermem.fx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "executor"))
from gpt_torch import VOCAB, Gpt  # noqa: E402

EXEC = os.environ.get("TIERMEM_EXEC", "tiermem-exec")
CORPUS = os.path.join(HERE, "..", "data", "corpus.txt")
STEPS = 30


def test_an_exported_gpt_trains_as_the_module_does_in_pytorch(daemon, tmp_path):
    torch.manual_seed(5)
    module = Gpt(2, 32, 4, 16, 64)
    reference = copy.deepcopy(module)
    model = tiermem.fx.export(module, torch.zeros(4, 16, dtype=torch.long), str(tmp_path / "gpt.pbtxt"),
                              dataset="text:fortunes",
                              optimizer={"type": "ADAM", "learning_rate": 0.003, "beta1": 0.9, "beta2": 0.99,
                                         "epsilon": 1e-8})
    dump = tmp_path / "dump"
    run = subprocess.run([EXEC, "train", model, "--socket", daemon.socket, "--job", "fx", "--data", CORPUS,
                          "--steps", str(STEPS), "--micro-batches", "1", "--dump", str(dump), "--dump-batches",
                          str(STEPS), "--losses", str(tmp_path / "losses"), "-q"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    ours = [float.fromhex(l) if "p" in l else float(l) for l in (tmp_path / "losses").read_text().split()]

    optimizer = torch.optim.Adam(reference.parameters(), lr=0.003, betas=(0.9, 0.99), eps=1e-8)
    theirs = []
    for step in range(STEPS):
        ids = torch.from_numpy(numpy.fromfile(dump / f"batch{step}_mb0.ids.i32", numpy.int32)).long()
        nxt = torch.from_numpy(numpy.fromfile(dump / f"batch{step}_mb0.next.i32", numpy.int32)).long()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(ids.view(4, 16)).reshape(-1, VOCAB), nxt)
        loss.backward()
        optimizer.step()
        theirs.append(loss.item())
    assert len(ours) == STEPS
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    print(f"exported GPT: largest relative difference to PyTorch over {STEPS} steps: {worst:.2e}")
    assert worst < 1e-4, list(zip(ours, theirs))


class Sigmoid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.sigmoid(self.fc(x))  # no op for it


class ExactGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.act(self.fc(x))


def test_what_the_ir_cannot_express_is_refused_by_name_and_line(tmp_path):
    with pytest.raises(tiermem.fx.UnsupportedError,
                       match=r"aten\.sigmoid: the IR has no sigmoid op \(test_fx\.py:\d+ in forward: "
                             r"return torch\.sigmoid\(self\.fc\(x\)\)"):
        tiermem.fx.export(Sigmoid(), torch.zeros(2, 8), str(tmp_path / "s.pbtxt"), dataset="digits")
    assert not os.path.exists(tmp_path / "s.pbtxt")


def test_exact_gelu_maps_to_its_own_op_not_the_tanh_one(tmp_path):
    """nn.GELU() is erf's GELU: it used to be refused; it maps to GELU_EXACT
    (the tanh approximation stays GELU)."""
    path = tiermem.fx.export(ExactGelu(), torch.zeros(2, 8), str(tmp_path / "g.pbtxt"), dataset="digits")
    text = open(path).read()
    assert "type: GELU_EXACT" in text and "type: GELU " not in text
