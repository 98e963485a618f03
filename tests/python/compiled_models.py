"""Shared by test_fit_compiled.py and test_fit_compiled_offload.py: tiny Hugging Face
Llama, Qwen2 and GPT-2 models (2 layers, hidden 64; a wider Llama for offload), compiled
whole and trained under stash.torch.fit (or without it), read on the CPU meter users read,
and the compiled tolerance their training is compared within."""

import time

import pytest
import torch

import stash.torch
from stash.torch._cpu_meter import window
from stash.torch._meter import live_training_bytes

transformers = pytest.importorskip("transformers")
from models import decoder  # noqa: E402

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
VOCAB = 256
STEPS = 5


def llama(seed=0):
    """2 layers, hidden 64 (as qwen2)."""
    return decoder("llama", seed, vocab=VOCAB)


def qwen2(seed=0):
    return decoder("qwen2", seed, vocab=VOCAB)


def olmo2(seed=0):
    """OLMo 2: RMS norms on q and k, and after (not before) attention and the MLP."""
    return decoder("olmo2", seed, vocab=VOCAB, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256, use_cache=False,
        bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0)
    m = transformers.GPT2LMHeadModel(cfg)
    m.train()
    return m


def wide_llama(seed=0):
    """3 layers, hidden 128: at sequence 512 its saved values are 1-4 MiB, above the
    planner's smallest offload (1 MiB), so a plan may offload them."""
    return decoder("llama", seed, layers=3, hidden=128, vocab=VOCAB, positions=1024)


def deep_llama(seed=0):
    """4 layers, hidden 64: after a graph break before block 1, Dynamo compiles each of
    blocks 1-3 as a frame of its own."""
    return decoder("llama", seed, layers=4, vocab=VOCAB)


MODELS = {"llama": (llama, lambda m: m.model.layers), "qwen2": (qwen2, lambda m: m.model.layers),
          "deep_llama": (deep_llama, lambda m: m.model.layers),
          "gpt2": (gpt2, lambda m: m.transformer.h), "olmo2": (olmo2, lambda m: m.model.layers),
          "wide_llama": (wide_llama, lambda m: m.model.layers)}


def train(budget=None, steps=STEPS, backend="inductor", before=True, family="llama",
          seqs=None, accumulate=1, prepare=None, refusals=None):
    """Compiled AdamW steps (fit entered before or after torch.compile) of a `family` model,
    at sequence length 128 or seqs[i] at step i, the batch of 4 split into `accumulate`
    micro-batches whose gradients add up by hand (`prepare`: called on the model first,
    as a test that breaks its graph does): per step the loss, the peak on the CPU
    meter users read (c10's allocator above what was alive at the step's start, Note [One
    meter for every row] in _meter.py) and the host time; the final parameters; the
    handle. refusals: a list that a StashError goes to, ending the steps (else raised)."""
    torch._dynamo.reset()
    model, blocks = MODELS[family]
    m = model()
    if prepare is not None:
        prepare(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    make = (lambda: stash.torch.fit(blocks(m), budget, optimizer=opt, link=LINK)) \
        if budget is not None else (lambda: None)
    h = make() if before else None
    cm = torch.compile(m, backend=backend)
    if not before:
        h = make()
    g = torch.Generator().manual_seed(1)
    meter = window()
    assert meter is not None, "the counting allocator could not be built"
    steps_out = []
    try:
        for i in range(steps):
            ids = torch.randint(0, VOCAB, (4, seqs[i] if seqs else 128), generator=g)
            base = live_training_bytes(m, opt, ids)
            meter.reopen()
            t0 = time.perf_counter()
            try:
                for part in ids.chunk(accumulate):
                    loss = cm(input_ids=part, labels=part).loss
                    (loss / accumulate).backward()
            except stash.StashError as e:
                if refusals is None:
                    raise
                refusals.append(e)
                break
            opt.step()
            opt.zero_grad()
            steps_out.append({"loss": loss.detach().clone(), "peak": base + meter.peak(),
                              "s": time.perf_counter() - t0})
    finally:
        meter.close()
    return steps_out, [p.detach().clone() for p in m.parameters()], h


def same_training(ref, ref_params, got, params):
    # Within the compiled tolerance (Note [Planning the compiled graph]); an offloaded
    # value comes back bit for bit, so offload adds nothing to it.
    assert all(torch.allclose(a["loss"], b["loss"], rtol=1e-5, atol=0)
               for a, b in zip(ref, got)), ([a["loss"] for a in ref], [b["loss"] for b in got])
    diff = max((a - b).abs().max().item() for a, b in zip(ref_params, params))
    assert diff <= 1e-5, diff
