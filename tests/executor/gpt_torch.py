"""The GPT of config/models/gpt_tiny.pbtxt as a PyTorch module (pre-norm
blocks of causal self-attention and a GELU MLP, bytes as tokens), for the
parity test (tests/executor/torch_gpt_reference.py) and the GPU bench
(bench/torch_gpt_step.py)."""
import torch
import torch.nn.functional as F

VOCAB = 256


class Block(torch.nn.Module):
    def __init__(self, width, heads, mlp):
        super().__init__()
        self.width, self.heads = width, heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, mlp)
        self.out = torch.nn.Linear(mlp, width)

    def attention(self, x):
        b, t, _ = x.shape
        width, heads = self.width, self.heads
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (z.view(b, t, heads, width // heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (width // heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        p = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
        return self.proj((p @ v).transpose(1, 2).reshape(b, t, width))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, layers, width, heads, context, mlp):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, width)
        self.pos = torch.nn.Parameter(torch.zeros(context, width))
        self.blocks = torch.nn.ModuleList(Block(width, heads, mlp) for _ in range(layers))
        self.lnf = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB, bias=False)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x))
