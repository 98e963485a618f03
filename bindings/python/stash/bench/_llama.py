"""The benchmarks' model and data: a Hugging Face LlamaForCausalLM from a config (random
weights, no download), the same for every system a benchmark compares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

if TYPE_CHECKING:  # for the hints only: torch and transformers load when a benchmark runs
    import torch
    from transformers import LlamaForCausalLM

    Device = Union[str, torch.device]

SIZES: Dict[str, Dict[str, Any]] = {
    # hidden, layers, heads, kv heads, ffn, seq, batch, vocab, dtype
    "tiny": dict(hidden=128, layers=4, heads=4, kv=2, ffn=256, seq=256, batch=4, vocab=256,
                 dtype="float32"),
    # Llama 3 8B's layer (hidden 4096, GQA 32/8, ffn 14336) at sequence 4096, bf16.
    "h200": dict(hidden=4096, layers=8, heads=32, kv=8, ffn=14336, seq=4096, batch=2,
                 vocab=32000, dtype="bfloat16"),
    # The same layer, 16 of them at batch 4: keep-all near 90 GB (parameters, gradients
    # and AdamW's state about 30 GB, saved activations about 3.3 GB a layer): most of an
    # H200's 141 GB, so that the budgets are the ones an H200's user chooses between.
    "h200-fill": dict(hidden=4096, layers=16, heads=32, kv=8, ffn=14336, seq=4096, batch=4,
                      vocab=32000, dtype="bfloat16"),
}


def size_for(device: Device) -> str:
    """The largest size whose keep-all step fits the device's memory with room to spare
    (--size auto): h200-fill (keep-all near 90 GB) from 120 GiB (an H200), h200 (near 40
    GB) from 60 GiB (an 80 GB H100), tiny on anything smaller and on the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return "tiny"
    total = torch.cuda.get_device_properties(dev).total_memory
    if total >= 120 * 2**30:
        return "h200-fill"
    return "h200" if total >= 60 * 2**30 else "tiny"


def model(size: Dict[str, Any], seed: int, device: Device) -> LlamaForCausalLM:
    """A LlamaForCausalLM with SDPA attention in train mode; the same weights for a seed."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        intermediate_size=size["ffn"], num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"], num_key_value_heads=size["kv"],
        max_position_embeddings=size["seq"], use_cache=False,
        **{"attn_implementation": "sdpa", "torch_dtype": getattr(torch, size["dtype"])})
    with torch.device(device):
        m: LlamaForCausalLM = transformers.LlamaForCausalLM(cfg).to(getattr(torch, size["dtype"]))
    m.train()
    return m


def data(size: Dict[str, Any], steps: int, device: Device,
         lengths: Optional[Tuple[int, int]] = None) -> List[torch.Tensor]:
    """steps batches of token ids (batch x seq), the same for every run; with lengths
    (lo, hi), each batch's length is drawn from the multiples of 8 in [lo, hi] (seeded)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(1)
    out = []
    for _ in range(steps):
        seq = size["seq"]
        if lengths is not None:
            lo, hi = (lengths[0] + 7) // 8, lengths[1] // 8
            seq = 8 * int(torch.randint(lo, hi + 1, (1,), generator=g).item())
        out.append(torch.randint(0, size["vocab"], (size["batch"], seq), generator=g).to(device))
    return out
