"""A GPT-2 written the way Hugging Face's transformers writes it
(modeling_gpt2.py: GPT2Attention, GPT2MLP, GPT2Block, GPT2LMHeadModel), for
the importer's tests: transformers itself is not on these machines, so this
is the same computation in the same form, not its code. What matters for an
importer is kept as HF has it:

- Conv1D: a weight [in, out] (transposed against nn.Linear) applied with
  addmm(bias, x.view(-1, in), weight);
- heads split by view + permute(0, 2, 1, 3), merged by permute +
  contiguous + view;
- the scale as a division by torch.full([], d ** 0.5), the causal mask a
  boolean buffer applied with torch.where(mask, w, finfo(dtype).min);
- gelu_new written out: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
- position ids from arange, wpe an Embedding; lm_head tied to wte.
"""

import math

import torch
from torch import nn


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, n_embd, n_head, n_positions):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n_positions, n_positions), dtype=torch.bool)).view(
            1, 1, n_positions, n_positions), persistent=False)
        self.embed_dim = n_embd
        self.num_heads = n_head
        self.head_dim = n_embd // n_head
        self.split_size = n_embd
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)

    def _attn(self, query, key, value):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype,
                                                 device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        return torch.matmul(attn_weights, value), attn_weights

    def _split_heads(self, tensor, num_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        return tensor.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        new_shape = tensor.size()[:-2] + (num_heads * attn_head_size,)
        return tensor.view(new_shape)

    def forward(self, hidden_states):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        attn_output, _ = self._attn(query, key, value)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        return self.resid_dropout(self.c_proj(attn_output))


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, n_embd):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, n_embd)
        self.c_proj = Conv1D(n_embd, intermediate_size)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(0.0)

    def forward(self, hidden_states):
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, n_positions):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = GPT2Attention(n_embd, n_head, n_positions)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = GPT2MLP(4 * n_embd, n_embd)

    def forward(self, hidden_states):
        hidden_states = hidden_states + self.attn(self.ln_1(hidden_states))
        return hidden_states + self.mlp(self.ln_2(hidden_states))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList([GPT2Block(n_embd, n_head, n_positions) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tie_word_embeddings
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)

    def forward(self, input_ids, labels=None):
        input_shape = input_ids.size()
        position_ids = torch.arange(0, input_shape[-1], dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden_states = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h:
            hidden_states = block(hidden_states)
        lm_logits = self.lm_head(self.ln_f(hidden_states))
        loss = None
        if labels is not None:
            # transformers shifts the labels inside; tiermem-exec's targets are already the next tokens.
            loss = nn.functional.cross_entropy(lm_logits.view(-1, lm_logits.size(-1)), labels.view(-1))
        return loss, lm_logits
