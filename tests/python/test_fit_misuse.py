"""stash.torch.fit misused, as a new user may: a budget or link that does not parse, a
budget below the parameters, blocks called twice or out of order, torch's own
checkpointing around the blocks, CPU torch without stash's test double: each refused at
once with a StashError naming it, the blocks left as they were. And settings a model
brings that fit turns off for its blocks (a KV cache in training, Hugging Face's gradient
checkpointing), with one warning each, training bitwise that without them."""

import warnings

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch
from offload_helpers import refused_without_the_double

pytest.importorskip("transformers")
from test_fit import LINK, actions, assert_bitwise, batches, llama, train  # noqa: E402


@pytest.mark.parametrize("bad", ["40 parsecs", "150%", "0%", "-5", 2.5, None, True])
def test_budget_that_does_not_parse(bad):
    _, blocks = llama(layers=2, hidden=64)
    with pytest.raises(stash.StashError, match="budget"):
        stash.torch.fit(blocks, bad)
    assert not any("forward" in vars(b) for b in blocks)


def test_bad_link_is_refused_at_once():
    _, blocks = llama(layers=2, hidden=64)
    with pytest.raises(stash.StashError, match="link"):
        stash.torch.fit(blocks, "90%", link={"h2d_gbps": 10})
    with pytest.raises(stash.StashError, match="positive"):
        stash.torch.fit(blocks, "90%", link={"h2d_gbps": 0, "d2h_gbps": 1, "bidir_gbps": 1})
    assert not any("forward" in vars(b) for b in blocks)


def test_budget_below_the_parameters_is_refused_at_once():
    _, blocks = llama(layers=2, hidden=64)
    with pytest.raises(stash.StashError, match="parameters and gradients"):
        stash.torch.fit(blocks, "1KiB")


def test_block_called_twice_per_step_is_refused():
    torch.manual_seed(0)
    shared = nn.Linear(32, 32)
    with pytest.raises(stash.StashError, match="same module"):
        stash.torch.fit([shared, nn.Linear(32, 32), shared], "90%", link=LINK)

    # A model whose forward calls block 0 again before block 1: refused, state untouched.
    blocks = nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32)])
    h = stash.torch.fit(blocks, "90%", link=LINK)
    x = torch.randn(8, 32, requires_grad=True)
    with pytest.raises(stash.StashError, match="twice"):
        blocks[0](blocks[0](x))
    assert all(p.grad is None for p in blocks.parameters())
    h.close()


def test_blocks_out_of_order_are_refused():
    blocks = nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32)])
    h = stash.torch.fit(blocks, "90%", link=LINK)
    with pytest.raises(stash.StashError, match="in order"):
        blocks[1](torch.randn(8, 32, requires_grad=True))
    h.close()


def test_a_kv_cache_in_training_is_turned_off_for_the_blocks():
    """Note [The loops fit lives in] in stash/torch/_fit_api.py: use_cache=True in training
    gets what Hugging Face's gradient checkpointing does (the blocks see no cache), with
    one warning; training is bitwise that of use_cache=False."""
    data = batches(n=3, batch=2, seq=32)
    model, _ = llama(layers=2, hidden=64)
    expected = train(model, data)
    model, blocks = llama(layers=2, hidden=64)
    model.config.use_cache = True
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = train(model, data, lambda opt: stash.torch.fit(blocks, "90%", optimizer=opt,
                                                              link=LINK))
    got[2].close()
    assert_bitwise(got, expected)
    cache = [w for w in seen if "key/value cache" in str(w.message)]
    assert len(cache) == 1 and "use_cache = False" in str(cache[0].message)
    # Note [Warnings at the user's line]: the loop's line (train(), in test_fit.py), not
    # stash's.
    assert cache[0].filename == train.__code__.co_filename, cache[0].filename
    assert [s["mode"] for s in got[2].report()["steps"]] == ["measure", "plan", "plan"]


def test_hugging_face_gradient_checkpointing_is_turned_off_while_fit_runs():
    """Note [The loops fit lives in] in stash/torch/_fit_api.py: gradient checkpointing enabled
    on the model (as a Trainer with gradient_checkpointing=True does, after fit was
    entered) is turned off for the blocks with one warning, the share planned (before,
    70% was refused: a checkpointed block saves nothing fit can plan), training bitwise
    that of the model without it, and on again after close()."""
    data = batches(n=3, batch=4, seq=128)
    model, _ = llama(layers=3, hidden=128)
    expected = train(model, data)
    model, blocks = llama(layers=3, hidden=128)

    def fit(opt):
        h = stash.torch.fit(blocks, "70%", optimizer=opt, link=LINK)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return h
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = train(model, data, fit)
    assert_bitwise(got, expected)
    steps = got[2].report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan"], steps
    assert got[2].plan is not None and actions(got[2].plan)["recompute"] > 0
    assert not any(b.gradient_checkpointing for b in blocks)
    said = [w for w in seen if "gradient checkpointing is on" in str(w.message)]
    assert len(said) == 1 and "gradient_checkpointing_disable" in str(said[0].message)
    assert said[0].filename == train.__code__.co_filename, said[0].filename
    got[2].close()
    assert all(b.gradient_checkpointing for b in blocks)


def test_torch_checkpoint_around_a_block_is_named():
    """torch.utils.checkpoint around the blocks takes every tensor they save: refused at
    the measuring step's first block, naming it, not planned on what it hides."""
    from torch.utils.checkpoint import checkpoint
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
                            for _ in range(3)])
    x = torch.randn(8, 16, 32, requires_grad=True)
    with stash.torch.fit(blocks, "70%", link=LINK):
        with pytest.raises(stash.StashError, match=r"block 0 \(Sequential\) runs under "
                           "torch.utils.checkpoint"):
            for b in blocks:
                x = checkpoint(b, x, use_reentrant=False)


def test_cpu_torch_without_the_double_is_refused():
    refused_without_the_double("stash.torch.fit(blocks, '1GiB')")
