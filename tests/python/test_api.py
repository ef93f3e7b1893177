"""The tiermem module against a real daemon: round trips, zero-copy views,
atomics, the control calls, and bad input (the process and the daemon live)."""

import threading
import time

import numpy as np
import pytest
import torch

import tiermem
from conftest import Daemon

NUMPY_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                np.float16, np.float32, np.float64, np.complex64, np.complex128]
TORCH_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (4, 1, 9)]


def numpy_sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    a = raw.view(dtype).reshape(shape)
    if dtype == np.bool_:
        a = (raw % 2).astype(np.bool_).reshape(shape)
    return a


def torch_sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g).to(dtype) if not dtype.is_complex else \
            torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=g, dtype=dtype)


def test_gva_prints_and_parses(client):
    a = client.alloc(4096, name="gva-text")
    text = str(a.gva)
    parsed = tiermem.Gva(text)  # node and offset; generation 0: not checked
    assert (parsed.node, parsed.offset, parsed.generation) == (a.gva.node, a.gva.offset, 0)
    assert eval(repr(a.gva), {"tiermem": tiermem}) == a.gva
    assert eval(repr(parsed), {"tiermem": tiermem}) == parsed
    assert (a.gva + 4096).offset == a.gva.offset + 4096
    assert len({a.gva, a.gva + 0, parsed}) == 2
    with pytest.raises(tiermem.AddressError) as e:
        tiermem.Gva("0001:zz")
    assert e.value.code == "bad_gva" and "0001:zz" in e.value.message
    client.write(text, b"by text")  # a GVA's text form and an Allocation are GVAs too
    assert client.read(a, 7) == b"by text"
    a.free()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_round_trips_through_write_read_and_map(client, dtype):
    with client.alloc(1 << 16, tier="dram") as a:
        for i, shape in enumerate(SHAPES):
            x = numpy_sample(dtype, shape, i)
            client.write(a.gva + 8 * i, x)  # unaligned for the wider types
            got = np.frombuffer(client.read(a.gva + 8 * i, x.nbytes), dtype=dtype).reshape(shape)
            np.testing.assert_array_equal(got, x)
            into = np.empty_like(x)
            assert client.read_into(a.gva + 8 * i, into) == x.nbytes
            np.testing.assert_array_equal(into, x)
        x = numpy_sample(dtype, (5, 6), 99)
        client.write(a.gva, x)
        with client.map(a.gva) as m:
            view = np.asarray(m)[:x.nbytes].view(dtype).reshape(x.shape)
            np.testing.assert_array_equal(view, x)
            del view


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_round_trips_through_write_read_and_dlpack(client, dtype):
    with client.alloc(1 << 16, tier="pmem") as a:
        for i, shape in enumerate(SHAPES):
            t = torch_sample(dtype, shape, i)
            client.write(a.gva + 64 * i, t)
            back = torch.empty(shape, dtype=dtype)
            assert client.read_into(a.gva + 64 * i, back) == t.numel() * t.element_size()
            assert torch.equal(back, t)
        t = torch_sample(dtype, (6, 7), 5)
        client.write(a.gva, t)
        with client.map(a.gva) as m:
            view = torch.from_dlpack(m)[:t.numel() * t.element_size()].view(dtype).view(t.shape)
            assert torch.equal(view, t)
            del view


def test_a_tensor_from_dlpack_is_the_tiers_memory(daemon, client):
    a = client.alloc(1 << 20, tier="dram", name="shared-tensor")
    m = client.map(a.gva)
    t = torch.from_dlpack(m).view(torch.float32)
    assert t.shape == (m.size // 4,)
    t[:4] = torch.tensor([1.5, -2.0, 3.25, 42.0])
    # Another process (tiermemctl, through the daemon) reads what the tensor wrote.
    out = daemon.ctl("read", str(a.gva), "16").stdout
    assert np.frombuffer(out, np.float32).tolist() == [1.5, -2.0, 3.25, 42.0]
    # And the tensor sees what a write through the library put there.
    client.write(a.gva + 4, np.array([7.0], np.float32))
    assert t[1].item() == 7.0
    arr = np.asarray(m)
    assert arr.ctypes.data == t.data_ptr()  # one memory, two views
    assert m.views == 2
    with pytest.raises(tiermem.RequestError) as e:
        m.close()
    assert e.value.code == "failed_precondition" and "view" in e.value.message
    del t, arr
    assert m.views == 0
    m.close()
    assert m.closed
    with pytest.raises(BufferError):
        memoryview(m)
    a.free()


def test_atomics_and_the_control_calls(client):
    c = client.alloc(4096, coherent=True)
    assert client.fetch_add(c.gva, 5) == 0
    assert client.fetch_add(c.gva, 2**64 - 1) == 5  # modulo 2**64
    assert client.compare_swap(c.gva, 4, 10) == 4
    assert client.compare_swap(c.gva, 4, 11) == 10  # not stored
    assert client.fetch_add(c.gva, 0) == 10
    c.free()

    a = client.alloc(100_000, tier="dram", name="ctl-calls")
    assert a.size >= 100_000 and a.tier == "dram" and a.name == "ctl-calls" and a.lifetime == "persistent"
    assert not a.demotable
    d = client.alloc(1 << 16, tier="dram", demotable=True)
    assert d.demotable and any(x.gva == d.gva and x.demotable for x in client.ls())  # as the daemon lists it
    d.free()
    assert client.lookup("ctl-calls").gva == a.gva
    assert any(x.gva == a.gva for x in client.ls())
    data = np.arange(25_000, dtype=np.int32)
    client.write(a, data)
    moved = client.migrate(a.gva, "pmem")
    assert moved.gva == a.gva and moved.tier == "pmem"
    np.testing.assert_array_equal(np.frombuffer(client.read(a, data.nbytes), np.int32), data)
    stat = client.stat()
    assert stat["node"] == client.node and {t["tier"] for t in stat["tiers"]} >= {"dram", "pmem"}
    assert client.nodes()[0]["node"] == client.node
    assert client.health()["nodes"][0]["state"] == "self"
    counters = client.access_counters()
    assert set(counters) == {"direct_local", "direct_remote", "message", "through_daemon", "requests_sent",
                             "staged_device"}
    assert counters["direct_local"] > 0 and counters["message"] == counters["direct_remote"] == 0
    assert counters["staged_device"] == 0  # no CUDA buffer here
    client.free(a.gva)
    with pytest.raises(tiermem.RequestError) as e:
        client.lookup("ctl-calls")
    assert e.value.code == "not_found"


def test_context_managers_free_and_close(daemon):
    with daemon.connect() as c:
        with c.alloc(4096, name="scoped") as a:
            gva = a.gva
        with pytest.raises(tiermem.AddressError) as e:
            c.read(gva, 1)
        assert e.value.code == "not_allocated"
    assert c.closed
    with pytest.raises(tiermem.TransportError) as e:
        c.alloc(4096)
    assert e.value.code == "connection_closed" and "closed" in str(e.value)


def test_session_allocations_go_with_their_client(daemon, client):
    with daemon.connect() as other:
        gva = other.alloc(4096, lifetime="session", name="session-scratch").gva
    # This process lives on: the allocation waits lease.grace_ms (1 s) for it
    # to connect again, then goes.
    for _ in range(500):
        try:
            client.lookup("session-scratch")
        except tiermem.RequestError:
            break
        threading.Event().wait(0.01)
    with pytest.raises(tiermem.Error):
        client.read(gva, 1)


class FakeCudaTensor:
    """Says it lives on cuda:0 in a process without the CUDA driver (this
    test's): its memory must never be asked for."""

    asked = False
    device = (2, 0)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        FakeCudaTensor.asked = True
        raise AssertionError("__dlpack__ of a device tensor was called")


class FakeRocmTensor(FakeCudaTensor):
    """Says it lives on a ROCm device, which tiermem does not take."""

    device = (10, 1)


def test_bad_input_raises_the_right_exception_and_the_process_lives(client):
    a = client.alloc(4096, tier="dram")
    with pytest.raises(TypeError, match="buffer protocol nor __dlpack__"):
        client.write(a.gva, 12345)
    with pytest.raises(TypeError, match="GVA"):
        client.write(12345, b"x")
    with pytest.raises(TypeError, match="read-only"):
        client.read_into(a.gva, b"immutable")
    with pytest.raises(TypeError, match="contiguous"):
        client.write(a.gva, np.arange(20, dtype=np.int64)[::2])
    with pytest.raises(TypeError, match="contiguous"):
        client.write(a.gva, torch.arange(20).view(4, 5).t())
    with pytest.raises(tiermem.RequestError) as e:
        client.write(a.gva, FakeCudaTensor())
    assert e.value.code == "not_supported" and "cuda:0" in e.value.message and not FakeCudaTensor.asked
    assert "not loaded the CUDA driver" in e.value.message
    with pytest.raises(tiermem.RequestError) as e:
        client.read_into(a.gva, FakeRocmTensor())
    assert e.value.code == "not_supported" and "rocm:1" in e.value.message and not FakeCudaTensor.asked
    with pytest.raises(tiermem.RequestError) as e:
        client.write(a.gva + 4000, bytes(200))  # past the end
    assert e.value.code == "out_of_range"
    with pytest.raises(tiermem.RequestError) as e:
        client.read(a.gva, 1 << 20)  # read past the end
    assert e.value.code == "out_of_range"
    with pytest.raises((MemoryError, tiermem.Error)):
        client.read(a.gva, 1 << 62)  # absurd: refused before any byte moves
    with pytest.raises(tiermem.RequestError) as e:
        client.fetch_add(a.gva + 3, 1)  # unaligned
    assert e.value.code == "invalid_argument"
    with pytest.raises(tiermem.RequestError) as e:
        client.alloc(0)
    assert e.value.code == "invalid_argument"
    with pytest.raises(tiermem.RequestError, match="tier"):
        client.alloc(4096, tier="floppy")
    with pytest.raises(tiermem.RequestError, match="lifetime"):
        client.alloc(4096, lifetime="forever")
    with pytest.raises(tiermem.RequestError, match="coherent and demotable") as e:
        client.alloc(4096, coherent=True, demotable=True)
    assert e.value.code == "invalid_argument"
    with pytest.raises(tiermem.AddressError) as e:
        client.alloc(1 << 50)  # absurd
    assert e.value.code in ("tier_exhausted", "quota_exceeded")
    with pytest.raises(TypeError):  # pybind11: not an unsigned size
        client.alloc(-1)
    client.free(a.gva)
    with pytest.raises(tiermem.AddressError) as e:
        client.write(a.gva, b"after free")
    assert e.value.code == "not_allocated"
    with pytest.raises(tiermem.AddressError):
        client.free(a.gva)
    assert isinstance(e.value, tiermem.Error) and e.value.number == 201
    # Still serving.
    b = client.alloc(4096)
    client.write(b, b"alive")
    assert client.read(b, 5) == b"alive"
    b.free()


def test_threads_write_and_read_at_once(client):
    a = client.alloc(8 << 20, tier="dram")
    errors = []

    def worker(i):
        try:
            x = np.full(1 << 18, i, np.int32)  # 1 MiB each
            for _ in range(20):
                client.write(a.gva + i * x.nbytes, x)
                np.testing.assert_array_equal(np.frombuffer(client.read(a.gva + i * x.nbytes, x.nbytes), np.int32), x)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    a.free()


def test_a_mapping_whose_allocation_did_not_survive_a_restart_is_revoked():
    """A mapping of a session allocation is revoked when its daemon restarts:
    `revoked` says why, check() raises it, no new view of it is made, and a
    new allocation on its frames is never written through it."""
    d = Daemon()
    try:
        c = d.connect(name="mapper")
        a = c.alloc(128 << 10, tier="dram", strict=True, lifetime="session")
        m = c.map(a.gva)
        view = np.asarray(m)
        view[:4] = np.frombuffer(b"mine", np.uint8)
        del view
        assert m.revoked is None
        m.check()
        d.stop()
        d.start()
        deadline = time.monotonic() + 10
        while m.revoked is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert m.revoked is not None and "session" in m.revoked, m.revoked
        with pytest.raises(tiermem.AddressError):
            m.check()
        with pytest.raises(BufferError):
            memoryview(m)
        with pytest.raises(tiermem.AddressError):
            torch.from_dlpack(m)
        m.close()
        c.close()
    finally:
        d.close()


def test_a_batch_holds_its_buffers_and_reports_each_operation(client):
    import gc
    a = client.alloc(64 * 1024, tier="dram")
    counter = client.alloc(64, tier="dram", coherent=True)
    target = bytearray(4096)
    with client.batch() as b:
        # The data objects are dropped here at once: the batch holds them.
        for i in range(8):
            b.write(a.gva + i * 4096, bytes([i + 1]) * 4096)
        gc.collect()
        b.fence()
        reads = [b.read(a, 4096)]
        into = b.read_into(a, target)
        adds = [b.fetch_add(counter, 1) for _ in range(5)]
        missing = b.read(a, 128 * 1024)  # runs past the end: its own error
    assert len(b) == 8 + 1 + 1 + 5 + 1
    assert bytes(b.result(reads[0])) == bytes([1]) * 4096
    assert b.result(into) is target and bytes(target) == bytes([1]) * 4096
    assert sorted(b.value(i) for i in adds) == [0, 1, 2, 3, 4]
    code, message = b.status(missing)
    assert code == "out_of_range", message
    assert b.status(reads[0]) is None
    with pytest.raises(tiermem.RequestError):
        b.result(missing)
    with pytest.raises(tiermem.RequestError):
        b.write(a, b"late")  # the with-block ended
    b2 = client.batch()
    b2.read(a, 4096)
    b2.read(a, 128 * 1024)
    with pytest.raises(tiermem.RequestError) as e:
        b2.wait()
    assert "operation 1 of the batch" in str(e.value)
    client.free(a)
    client.free(counter)


def test_a_submitted_batch_runs_while_python_goes_on(client):
    import time
    a = client.alloc(64 * 1024, tier="dram")
    client.write(a, bytes(range(256)) * 256)
    b = client.batch()
    reads = [b.read(a.gva + i * 4096, 4096) for i in range(16)]
    assert b.status(reads[0]) == ("busy", "not submitted yet")
    b.submit()
    deadline = time.monotonic() + 30
    while not b.done and time.monotonic() < deadline:
        time.sleep(0.001)  # the GIL is free: the library's thread does the work
    assert b.done
    for i, r in enumerate(reads):
        assert bytes(b.result(r)) == (bytes(range(256)) * 256)[i * 4096:(i + 1) * 4096]
    b.wait()
    client.free(a)
