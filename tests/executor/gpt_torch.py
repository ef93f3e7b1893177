"""The GPT of config/models/gpt_tiny.pbtxt as a PyTorch module (pre-norm
blocks of causal self-attention and a GELU MLP, bytes as tokens), for the
parity test (tests/executor/torch_gpt_reference.py) and the GPU bench
(bench/torch_gpt_step.py)."""
import torch

VOCAB = 256


class CausalSelfAttention(torch.nn.Module):
    """q, k, v from one Linear, `heads` heads, causal, then a projection.
    (tiermem.fx maps a module of this name with qkv, proj and heads to its
    CAUSAL_ATTENTION; defined here too so that this file needs no tiermem.)"""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        scores = q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        return self.proj((scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c))


class Block(torch.nn.Module):
    def __init__(self, width, heads, mlp):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, mlp)
        self.act = torch.nn.GELU(approximate="tanh")
        self.out = torch.nn.Linear(mlp, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(self.act(self.fc(self.ln2(x))))


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
