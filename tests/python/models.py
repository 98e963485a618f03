"""Small models for the Python tests (CPU, float32)."""

import math

import torch
import torch.nn as nn

# Hugging Face's Llama-shaped families the tests train: (config class, model class).
_DECODERS = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
             "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
             "mistral": ("MistralConfig", "MistralForCausalLM"),
             "olmo2": ("Olmo2Config", "Olmo2ForCausalLM")}


def decoder(family="llama", seed=0, *, layers=2, hidden=64, ffn=None, vocab=256,
            positions=256, **config):
    """A small Hugging Face decoder of a Llama-shaped family, random init from `seed`, in
    train mode: 4 attention heads over 2 of keys and values, sdpa attention, no KV cache,
    an MLP twice `hidden` wide unless `ffn` says. `config` overrides or adds any config
    field (use_cache=True, attention_dropout=0.1, ...)."""
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in _DECODERS[family])
    fields = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn or 2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=positions, use_cache=False,
                  attn_implementation="sdpa")
    fields.update(config)
    torch.manual_seed(seed)
    m = model_class(config_class(**fields))
    m.train()
    return m


class Block(nn.Module):
    """A pre-norm transformer block: attention with one fused qkv projection, then an MLP."""

    def __init__(self, d=16, heads=2, ff=32):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        B, T, D = x.shape
        H, hd = self.heads, D // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hd)).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class Gated(nn.Module):
    """Saves two views of one storage (the halves of one projection), a parameter and a
    buffer: the record pass must list the projection once and skip the other two."""

    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, 2 * d, bias=False)
        self.scale = nn.Parameter(torch.ones(d))
        self.register_buffer("mask", torch.ones(d))

    def forward(self, x):
        a, b = self.lin(x).split(x.shape[-1], dim=-1)
        return (a * b) * self.scale * self.mask


class Scale(nn.Module):
    """x * w: saves only its input (w is a parameter), so a test can reach the one tensor
    the block saves from outside."""

    def __init__(self, d=8):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * self.w


class DropoutMLP(nn.Module):
    """A pre-norm MLP with dropout on its hidden activations: a recompute of it must draw
    the mask its forward drew (the forward's RNG state restored)."""

    def __init__(self, d=16, ff=32, p=0.25):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        return x + self.fc2(self.drop(torch.relu(self.fc1(self.ln(x)))))


class Masked(nn.Module):
    """Takes a keyword tensor (a mask shared by every block, which needs no gradient) and
    a non-tensor argument: a recompute must hand both back as the forward got them."""

    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, *, mask, scale=1.0):
        return torch.tanh(self.lin(x) * mask) * scale + x


class Unsteady(nn.Module):
    """Saves a differently shaped tensor on even calls than on odd ones: control flow that
    depends on something other than its inputs, parameters and RNG state, so that a
    recompute (the second call) does not save what the forward saved."""

    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.lin(x)
        if self.calls % 2 == 0:
            h = h[..., : h.shape[-1] // 2]
        return h.exp().tanh()
