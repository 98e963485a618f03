"""stash where people train: one line in a trainer.

- :class:`stash.integrations.transformers.StashCallback`: a Hugging Face ``TrainerCallback``
  that runs training under :func:`stash.torch.fit` with a budget (TRL's trainers subclass
  ``Trainer`` and take callbacks alike; they are not tested here).
- :func:`find_blocks`: a model's repeated blocks (a Hugging Face decoder's layers), through
  the wrappers trainers put around it (DDP, peft, torch.compile).
"""

from ._blocks import find_blocks

__all__ = ["find_blocks"]
