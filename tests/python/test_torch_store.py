"""tiermem.torch.StateStore against a real daemon: what goes in comes back
(nested state, every dtype, non-tensor values), as views of the tier's
memory; the last two commits are loadable; a second writer, a foreign
allocation and a state that outgrows its slots are refused."""

import pytest
import torch

import tiermem
import tiermem.torch


def sample_state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "weights": {"w": torch.randn(17, 9, generator=g), "b": torch.randn(9, generator=g).double()},
        "mask": torch.rand(33, generator=g) > 0.5,
        "counts": torch.randint(0, 1000, (4, 4), generator=g),
        "half": torch.randn(5, generator=g).half(),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "groups": [{"lr": 0.1 * seed, "params": [0, 1]}],
        "note": ("seed", seed),
    }


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_commits_come_back_as_views_of_the_tier(client):
    store = tiermem.torch.StateStore(client, "store-roundtrip")
    assert store.commits() == 0 and store.load() is None
    for step in (1, 2, 3):
        assert store.commit(step, sample_state(step)) == step
    assert store.steps() == [3, 2]
    step, state = store.load()
    assert step == 3
    assert_same(state, sample_state(3))
    # A view of the mapped allocation, not a copy.
    base = store._mapped
    w = state["weights"]["w"]
    assert base.data_ptr() <= w.data_ptr() < base.data_ptr() + base.numel()
    step, older = store.load(step=2)
    assert step == 2
    assert_same(older, sample_state(2))
    with pytest.raises(ValueError, match="holds steps"):
        store.load(step=1)
    copied = store.load(copy=True)[1]["weights"]["w"]
    assert torch.equal(copied, w) and not base.data_ptr() <= copied.data_ptr() < base.data_ptr() + base.numel()
    with pytest.raises(tiermem.RequestError):  # views alive: the mapping stays
        store.close()
    del state, older, w, base
    store.free()
    with pytest.raises(tiermem.RequestError):
        client.lookup("store-roundtrip")


def test_a_restarted_process_finds_the_last_commit(daemon):
    with daemon.connect() as first:
        tiermem.torch.StateStore(first, "store-restart").commit(7, sample_state(7))
    with daemon.connect() as second:
        store = tiermem.torch.StateStore(second, "store-restart")
        step, state = store.load(copy=True)
        assert step == 7
        assert_same(state, sample_state(7))
        store.free()


def test_a_model_and_optimizer_resume_exactly(client):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    store = tiermem.torch.StateStore(client, "store-model")
    store.commit_training(3, model, opt, extra={"epoch": 0})
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
    assert store.resume(model2, opt2) == 3 and store.extra == {"epoch": 0}
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    x = torch.randn(4, 8)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)  # the optimizer's state came back too
    store.free()


def test_refusals(client):
    store = tiermem.torch.StateStore(client, "store-small", headroom=0)
    store.commit(1, {"t": torch.zeros(100)})
    with pytest.raises(ValueError, match="more than the"):
        store.commit(2, {"t": torch.zeros(100_000)})
    # A second writer on the store (a replacement while the old process
    # lives on): whichever commits second is refused before it writes.
    other = tiermem.torch.StateStore(client, "store-small")
    assert other.commit(2, {"t": torch.ones(100)}) == 2
    with pytest.raises(RuntimeError, match="another writer"):
        store.commit(3, {"t": torch.zeros(100)})
    step, state = other.load(copy=True)
    assert step == 2 and torch.equal(state["t"], torch.ones(100))
    store.free()
    client.alloc(4096, name="not-a-store")
    with pytest.raises(ValueError, match="not a tiermem.torch.StateStore"):
        tiermem.torch.StateStore(client, "not-a-store")
    client.free(client.lookup("not-a-store"))
