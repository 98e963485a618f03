"""stash.torch.fit's count of what is not an activation: the parameters (the blocks' and
the optimizer's), their gradients, the blocks' buffers and the optimizer's state, from
their tensors (Note [What the budget counts] in _fit_steps.py). A part the handle owns; it
reads the blocks and the optimizer, nothing of the handle."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ._fit_support import _optimizer_state_bytes, _optimizer_state_estimate, _tensor_bytes


class TrainingBytes:
    """The bytes of the blocks' (and the optimizer's) training state, by storage."""

    def __init__(self, blocks: Sequence[torch.nn.Module],
                 optimizer: Optional[torch.optim.Optimizer]) -> None:
        self.blocks = list(blocks)
        self.optimizer = optimizer
        self._params: Optional[Tuple[Any, List[torch.Tensor]]] = None
        self._resident: Optional[int] = None

    def parameters(self) -> List[torch.Tensor]:
        """The blocks' parameters and, when fit knows the optimizer, the whole model's
        (embeddings and head included), each once. Note [What it costs] in _fit_passes.py:
        walking the blocks' modules costs more than a step's own bookkeeping, so the list
        is kept while the optimizer's groups stay the same (a block that gains parameters
        after fit began is not seen: it is not seen by the optimizer either)."""
        groups = self.optimizer.param_groups if self.optimizer is not None else []
        key = tuple((id(g["params"]), len(g["params"])) for g in groups)
        cached = self._params
        if cached is not None and cached[0] == key:
            return cached[1]
        seen: Dict[int, torch.Tensor] = {}
        for p in [p for b in self.blocks for p in b.parameters()] + [
                p for g in groups for p in g["params"]]:
            seen.setdefault(id(p), p)
        params = list(seen.values())
        self._params = (key, params)
        return params

    def trainable(self) -> int:
        """The bytes of the parameters that get a gradient."""
        return _tensor_bytes(p for p in self.parameters() if p.requires_grad)

    def gradients_alive(self) -> int:
        """The gradients that exist now, by storage (Note [Gradients by position] in
        _fit_gradients.py)."""
        return _tensor_bytes(p.grad for p in self.parameters() if p.grad is not None)

    def any_gradient(self) -> bool:
        """Whether any gradient exists now: gradients_alive() > 0 without counting them
        (Note [What it costs] in _fit_passes.py: counting is a storage lookup per parameter)."""
        return any(p.grad is not None for p in self.parameters())

    def state(self, grads: Optional[int] = None) -> int:
        """The gradients (grads, when the caller has just counted them) and optimizer
        state that exist now, by storage."""
        if grads is None:
            grads = self.gradients_alive()
        opt = self.optimizer
        return grads + (_optimizer_state_bytes(opt) if opt is not None else 0)

    def alive(self, inputs: Sequence[torch.Tensor], state: Optional[int] = None) -> int:
        """What is alive when block 0 starts, by storage: the parameters (the optimizer's
        too) and buffers, the gradients and optimizer state that exist (state, when the
        caller has just counted them), block 0's inputs. The parameters' and buffers'
        bytes are taken once (they live as long as fit)."""
        if self._resident is None:
            self._resident = _tensor_bytes(self.parameters() + [
                x for b in self.blocks for x in b.buffers()])
        if state is None:
            state = self.state()
        return self._resident + state + _tensor_bytes(inputs)

    def fixed_counted(self) -> int:
        """Parameters, gradients (as if allocated), buffers and optimizer state, from their
        tensors: the CPU path's non-activation bytes."""
        params = self.parameters()
        n = _tensor_bytes(params) + _tensor_bytes(p for p in params if p.requires_grad)
        n += _tensor_bytes(x for b in self.blocks for x in b.buffers())
        n += _optimizer_state_estimate(self.optimizer)
        return n
