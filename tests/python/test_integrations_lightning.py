"""stash.integrations.lightning: fit in PyTorch Lightning's Trainer (Note [fit in
Lightning]) on the CPU test double, bitwise against the same Lightning run without stash."""

import sys

import pytest
import torch


transformers = pytest.importorskip("transformers")
pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from models import decoder  # noqa: E402

VOCAB = 128
LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}


def llama(seed: int = 0) -> "transformers.LlamaForCausalLM":
    # With the KV cache on, as a model from from_pretrained has it.
    return decoder("llama", seed, vocab=VOCAB, positions=64, use_cache=True)


class CausalLM(pl.LightningModule):
    """A Hugging Face causal LM trained with AdamW, as a Lightning user writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.model = llama()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def token_rows(n: int = 24, seq: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    return torch.randint(0, VOCAB, (n, seq), generator=g)


def train(root, callbacks, *, max_steps: int = 6, accumulate: int = 1,
          validate: bool = False, ckpt_path=None):
    """Trains a fresh CausalLM; its parameters after training, and the module."""
    module = CausalLM()
    rows = token_rows()
    loader = torch.utils.data.DataLoader(rows, batch_size=2, shuffle=False)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False, enable_model_summary=False,
        accumulate_grad_batches=accumulate, default_root_dir=str(root), callbacks=callbacks,
        num_sanity_val_steps=1 if validate else 0,
        val_check_interval=2 * accumulate if validate else None,
        limit_val_batches=1 if validate else None)
    trainer.fit(module, loader, loader if validate else None, ckpt_path=ckpt_path)
    return [p.detach().clone() for p in module.parameters()], module


def equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_lightning_trains_bitwise_under_fit(tmp_path):
    from stash.integrations.lightning import StashCallback

    expected, _ = train(tmp_path / "plain", [])
    cb = StashCallback("90%", link=LINK)
    got, module = train(tmp_path / "stash", [cb])
    assert equal(expected, got)
    steps = cb.handle.report()["steps"]
    assert [s["mode"] for s in steps] == ["measure"] + ["plan"] * 5, steps
    assert all(s["micro_batches"] == 1 for s in steps), steps
    assert not any(s.get("aborted") for s in steps), steps
    # A measured plan's first run is its check and may exceed once (README); later ones not.
    assert not any(s["over_budget"] for s in steps[2:]), steps
    assert len(cb.handle.blocks) == 2
    assert cb.handle.optimizer is not None and type(cb.handle.optimizer) is torch.optim.AdamW
    assert module.model.config.use_cache is False
    assert cb.handle.engine is None  # on_train_end restored the blocks
    assert not cb.handle.optimizer._optimizer_step_pre_hooks  # the callback's and fit's
    assert any((tmp_path / "stash" / "stash").glob("fit-*.profile.json"))


def test_lightning_with_accumulation_and_validation_trains_bitwise(tmp_path):
    from stash.integrations.lightning import StashCallback

    expected, _ = train(tmp_path / "plain", [], max_steps=4, accumulate=2, validate=True)
    cb = StashCallback("90%", link=LINK)
    got, _ = train(tmp_path / "stash", [cb], max_steps=4, accumulate=2, validate=True)
    assert equal(expected, got)
    steps = cb.handle.report()["steps"]
    # Lightning runs the second micro-batch's forward and backward inside step(closure).
    assert [s["mode"] for s in steps] == ["measure", "plan", "plan", "plan"], steps
    assert all(s["micro_batches"] == 2 for s in steps), steps
    assert not any(s["over_budget"] for s in steps[2:]), steps


def test_a_run_resumed_from_a_checkpoint_starts_planned(tmp_path):
    from stash.integrations.lightning import StashCallback

    saves = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=2,
                            save_top_k=-1)
    first = StashCallback("90%", link=LINK)
    train(tmp_path, [first, saves], max_steps=2)
    checkpoint = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    assert checkpoint.is_file(), list((tmp_path / "ckpt").iterdir())
    again = StashCallback("90%", link=LINK)
    train(tmp_path, [again], max_steps=4, ckpt_path=str(checkpoint))
    steps = again.handle.report()["steps"]
    assert [s["mode"] for s in steps] == ["plan", "plan"], steps
    assert steps[0]["plan_source"] == "cache_dir"


def test_an_exception_in_training_restores_the_blocks(tmp_path):
    from stash.integrations.lightning import StashCallback

    class Fails(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 2:
                raise RuntimeError("stop here")

    cb = StashCallback("90%", link=LINK)
    with pytest.raises(RuntimeError, match="stop here"):
        train(tmp_path, [cb, Fails()])
    assert cb.handle is not None and cb.handle.engine is None  # on_exception closed it
    assert [s["mode"] for s in cb.handle.report()["steps"]] == ["measure", "plan"]


def test_importing_stash_integrations_does_not_import_lightning():
    import subprocess

    code = ("import sys, stash.integrations; "
            "print(any(m.split('.')[0] in ('lightning', 'pytorch_lightning') "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out
