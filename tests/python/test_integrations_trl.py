"""stash.integrations.transformers.StashCallback in TRL's SFTTrainer (a subclass of Hugging
Face's Trainer) on the CPU test double, offline: a tiny random Qwen2, a word-level
tokenizer built here, a pre-tokenized in-memory dataset. Bitwise against the same TRL run
without stash, with TRL's defaults (activation checkpointing on, which the callback turns
off: Note [fit in a Trainer])."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
tokenizers = pytest.importorskip("tokenizers")

from test_integrations import VOCAB, qwen  # noqa: E402

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}


def word_tokenizer() -> "transformers.PreTrainedTokenizerFast":
    """A tokenizer of VOCAB words t0..t{VOCAB-1}, so that SFTTrainer needs nothing from the
    hub (its processing_class; the dataset is tokenized already)."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    model = tokenizers.models.WordLevel(vocab, unk_token="t0")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(model), pad_token="t0", unk_token="t0",
        eos_token="t1")


def token_rows(n: int = 16, seq: int = 48) -> "datasets.Dataset":
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, VOCAB, (n, seq), generator=g)  # no pad (t0) or eos (t1) in them
    return datasets.Dataset.from_dict({"input_ids": ids.tolist()})


def sft(tmp_path, name, callbacks, max_steps: int = 4):
    """A fresh SFTTrainer run (TRL's defaults but fp32 on the CPU); the trained parameters."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(tmp_path / name), per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=max_steps, learning_rate=1e-3,
        report_to=[], use_cpu=True, bf16=False, dataloader_num_workers=0, seed=0,
        data_seed=0, save_strategy="no", logging_strategy="no", disable_tqdm=True)
    assert args.gradient_checkpointing  # TRL's default, which the callback turns off
    model = qwen()
    trainer = SFTTrainer(model=model, args=args, train_dataset=token_rows(),
                         processing_class=word_tokenizer(), callbacks=callbacks)
    trainer.train()
    return [p.detach().clone() for p in model.parameters()], model


def test_sft_trainer_trains_bitwise_under_fit(tmp_path):
    from stash.integrations.transformers import StashCallback

    expected, _ = sft(tmp_path, "plain", [])
    # 97%: on this tiny model SFTTrainer's own loss head (log-probabilities, entropy and
    # top-1 in chunks) leaves the blocks' activations a small share of the peak; the
    # smallest feasible budget is about 95% of keep-all.
    cb = StashCallback("97%", link=LINK)
    with pytest.warns(UserWarning, match="activation checkpointing off"):
        got, model = sft(tmp_path, "stash", [cb])
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert not model.is_activation_checkpointing
    steps = cb.handle.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan", "plan"], steps
    assert all(s["micro_batches"] == 2 for s in steps), steps
    assert not any(s["over_budget"] for s in steps[2:]), steps
    plan = cb.handle.plan  # the plan does something below keep-all
    assert any(t["action"] != "keep" for layer in plan["layers"] for t in layer["tensors"])
    assert cb.handle.engine is None  # on_train_end restored the blocks
