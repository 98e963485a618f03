"""stash.torch.record: the record pass (Note [What the record pass counts])."""

import json

import pytest
import torch

import stash.profile
import stash.torch
from models import Block, Gated

B, T, D, FF = 2, 8, 16, 32
F32 = 4
ACT = B * T * D * F32          # one activation of the residual stream
STAT = B * T * F32             # layer-norm mean or rstd
ATT = B * 2 * T * T * F32      # softmax probabilities (2 heads)


def _blocks(n=2):
    torch.manual_seed(0)
    return [Block(D, 2, FF) for _ in range(n)]


def test_transformer_block_tensors_in_save_order():
    doc = stash.torch.record(_blocks(), torch.randn(B, T, D))
    assert len(doc["layers"]) == 2
    # Derived by hand for torch 2.x (CPU): ln1 saves x, mean, rstd; qkv saves ln1's
    # output; q@k^T saves copies of q and k (transposed, reshaped); the division by a
    # Python float saves no tensor (torch 1.13 saved it as a wrapped 0-dim double);
    # softmax saves its output; att@v saves the probabilities again (a view: not listed
    # twice) and a copy of v; proj saves y; ln2 saves the residual, mean, rstd; fc1 saves
    # ln2's output; relu saves its output, which fc2 saves again (a view: listed once).
    # Weights (saved as W^T) are skipped.
    expected = [ACT, STAT, STAT, ACT, ACT, ACT, ATT, ACT, ACT, ACT, STAT, STAT, ACT,
                B * T * FF * F32]
    for layer in doc["layers"]:
        assert [t["bytes"] for t in layer["tensors"]] == expected
        names = [t["name"] for t in layer["tensors"]]
        assert names[0] == "input" and len(set(names)) == len(names)
        assert [t["recomputable"] for t in layer["tensors"]] == [False] + [True] * 13
        assert all(t["offloadable"] and not t["must_keep"] for t in layer["tensors"])
        assert all(t["recompute_ms"] == 0 for t in layer["tensors"])
    # Identical blocks share a signature (the planner solves them once).
    assert doc["layers"][0]["signature"] == doc["layers"][1]["signature"]


def test_views_counted_once_parameters_and_buffers_skipped():
    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    doc = stash.torch.record([Gated(8)], x)
    tensors = doc["layers"][0]["tensors"]
    # lin saves x ("input"); a*b saves both halves of lin's output: one storage, listed
    # once with the storage's bytes; (a*b)*scale saves a*b (scale is a parameter:
    # skipped); *mask saves only mask (a buffer, which needs no gradient: skipped).
    assert [(t["name"], t["bytes"]) for t in tensors] == [
        ("input", 4 * 8 * 4), ("saved.1", 4 * 16 * 4), ("saved.2", 4 * 8 * 4)]
    assert [t["recomputable"] for t in tensors] == [False, True, True]


def test_input_of_later_blocks_is_the_previous_output():
    blocks = _blocks(3)
    doc = stash.torch.record(blocks, torch.randn(B, T, D))
    for layer in doc["layers"]:
        first = layer["tensors"][0]
        assert first == {"name": "input", "bytes": ACT, "recompute_ms": 0.0,
                         "offloadable": True, "recomputable": False, "must_keep": False}


def test_skeleton_is_valid_profile_and_written(tmp_path):
    blocks = _blocks()
    path = tmp_path / "skeleton.json"
    doc = stash.torch.record(blocks, torch.randn(B, T, D), path, names=["b0", "b1"])
    on_disk = json.loads(path.read_text())
    assert on_disk == doc
    stash.profile.validate(on_disk)
    assert on_disk["schema"] == "stash.profile/1"
    assert [l["name"] for l in on_disk["layers"]] == ["b0", "b1"]
    params = sum(p.numel() for b in blocks for p in b.parameters()) * F32
    assert on_disk["fixed_bytes"] == 2 * params  # parameters and their gradients
    assert on_disk["device"]["name"] == "cpu"


def test_record_rejects_bad_arguments():
    with pytest.raises(ValueError):
        stash.torch.record([], torch.randn(1))
    with pytest.raises(ValueError):
        stash.torch.record(_blocks(2), torch.randn(B, T, D), names=["only one"])


def test_validate_names_the_field():
    doc = stash.torch.record(_blocks(1), torch.randn(B, T, D))
    bad = json.loads(json.dumps(doc))
    bad["layers"][0]["tensors"][1]["name"] = "input"
    with pytest.raises(stash.profile.ProfileError, match=r"layers\[0\]\.tensors\[1\]\.name"):
        stash.profile.validate(bad)
    bad = json.loads(json.dumps(doc))
    del bad["link"]["h2d_gbps"]
    with pytest.raises(stash.profile.ProfileError, match=r"link\.h2d_gbps"):
        stash.profile.validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["layers"][0]["tensors"][0]["bytes"] = -1
    with pytest.raises(stash.profile.ProfileError, match="non-negative"):
        stash.profile.validate(bad)
