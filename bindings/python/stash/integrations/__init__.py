"""stash where people train: one line in a trainer.

- :class:`stash.integrations.transformers.StashCallback`: a Hugging Face ``TrainerCallback``
  that runs training under :func:`stash.torch.fit` with a budget; TRL's trainers subclass
  ``Trainer`` and take it alike (tested with TRL's ``SFTTrainer``).
- :class:`stash.integrations.lightning.StashCallback`: the same as a PyTorch Lightning
  ``Callback`` (lightning.pytorch's or pytorch_lightning's Trainer).
- :func:`find_blocks`: a model's repeated blocks (a Hugging Face decoder's layers), through
  the wrappers trainers put around it (DDP, peft, torch.compile).

Importing this package imports neither transformers nor Lightning: each callback's module
imports its trainer's package.
"""

from ._blocks import find_blocks

__all__ = ["find_blocks"]
