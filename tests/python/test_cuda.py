"""CUDA tensors through tiermem (suite `gpu`, through run_cuda.py: run where
torch sees a CUDA device, skipped elsewhere): device tensors written to and
read from every tier, and a VRAM mapping as a CUDA tensor a kernel writes."""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device here", allow_module_level=True)

from conftest import Daemon  # noqa: E402


@pytest.fixture(scope="module")
def daemon():
    d = Daemon(vram="256MiB")
    yield d
    alive = d.proc.poll() is None
    d.close()
    assert alive, "tiermemd died during the tests:\n" + d.log()


@pytest.mark.parametrize("tier", ["vram", "dram", "pmem"])
def test_cuda_tensors_in_and_out_of_every_tier(daemon, tier):
    with daemon.connect(name="cuda") as c:
        t = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 0.5 + 1
        a = c.alloc(t.numel() * 4 + 12, tier=tier)
        at = a.gva + 12  # unaligned
        c.write(at, t)
        back = torch.empty_like(t)
        c.read_into(at, back)
        assert torch.equal(back, t)
        host = c.read(at, t.numel() * 4)
        assert torch.equal(torch.frombuffer(bytearray(host), dtype=torch.float32), t.cpu())
        # a tensor still being computed on the default stream is read once done
        u = torch.ones(1 << 20, device="cuda")
        for _ in range(50):
            u = u * 1.0001
        c.write(at, u)
        c.read_into(at, back)
        assert torch.equal(back, u)
        # VRAM is reached by the copy engines from the tensor where it is;
        # host tiers through host memory (counted: staged_device).
        staged = c.access_counters()["staged_device"]
        assert staged == 0 if tier == "vram" else staged >= 4, (tier, staged)
        c.free(a)


def test_map_of_vram_is_a_cuda_tensor_kernels_write(daemon):
    with daemon.connect(name="cuda-map") as c:
        a = c.alloc(1 << 20, tier="vram")
        c.write(a.gva, torch.full((1 << 18,), 3.0, device="cuda"))
        m = c.map(a.gva)
        assert m.device == torch.cuda.current_device()
        with pytest.raises(BufferError, match="VRAM"):
            memoryview(m)
        t = torch.from_dlpack(m)
        assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == 1 << 20
        f = t.view(torch.float32)
        assert torch.all(f == 3.0)
        f.mul_(2)  # a kernel writing through the mapping
        torch.cuda.synchronize()
        del f, t
        m.close()
        out = torch.empty(1 << 18, device="cuda")
        c.read_into(a.gva, out)
        assert torch.all(out == 6.0)
        assert c.read(a.gva, 4) == torch.tensor([6.0]).numpy().tobytes()
        c.free(a)
