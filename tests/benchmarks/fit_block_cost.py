"""Where stash.torch.fit's per-step cost falls in a planned step's forward, block by block,
when its plan keeps everything (issue 20 item 6; Note [Lean blocks] in
stash/torch/_offload_hooks.py).

Method. Two copies of the peers' tiny Llama (stash.bench._llama, the same seed, AdamW,
zero_grad(set_to_none=True)): one trained plainly, one under stash.torch.fit with a budget
far above keep-all's peak. Every decoder layer carries a forward pre-hook and a forward
hook (module hooks: they run outside fit's wrapper), and the layer class's own forward is
timed inside (inside the wrapper), so each block splits into: before (pre-hook to its
forward: fit's wrapper and, at block 0, the step's start), its forward, after (its
forward's return to the forward hook: the wrapper's end and, at the last block, the
backward boundary), and the gaps between blocks. The two models alternate step by step,
the order swapped every round, for --rounds rounds after 5 warm-up rounds (fit's
measuring step is one of them). Reported: each segment's median in us, plain and fit, and
their difference.

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/fit_block_cost.py [--rounds 60] [--threads 2]
"""

import argparse
import functools
import statistics
import time

import torch
from transformers.models.llama import modeling_llama

import stash.torch
from stash.bench import _llama
from stash.bench._peer_systems import decoder_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    size = _llama.SIZES["tiny"]
    batches = _llama.data(size, 8, torch.device("cpu"))
    now = time.perf_counter
    marks = []  # (what, block, time) of the step running now

    inner = modeling_llama.LlamaDecoderLayer.forward

    @functools.wraps(inner)
    def timed(self, *args, **kwargs):
        marks.append(("forward", self.stash_index, now()))
        try:
            return inner(self, *args, **kwargs)
        finally:
            marks.append(("return", self.stash_index, now()))

    modeling_llama.LlamaDecoderLayer.forward = timed

    def make(under_fit):
        model = _llama.model(size, 0, torch.device("cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for k, b in enumerate(decoder_layers(model)):
            b.stash_index = k
            b.register_forward_pre_hook(lambda m, args: marks.append(("call", m.stash_index,
                                                                       now())))
            b.register_forward_hook(lambda m, args, out: marks.append(("hook", m.stash_index,
                                                                        now())))
        h = stash.torch.fit(decoder_layers(model), "1GiB", optimizer=opt) if under_fit else None
        return model, opt, h

    systems = {"plain": make(False), "fit": make(True)}
    segments = {k: [] for k in systems}
    names = None
    for r in range(a.rounds + 5):
        for k in (list(systems) if r % 2 == 0 else list(systems)[::-1]):
            model, opt, _ = systems[k]
            ids = batches[r % len(batches)]
            marks.clear()
            t0 = now()
            loss = model(input_ids=ids, labels=ids).loss
            t1 = now()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if r < 5:
                continue
            points = [("start", None, t0)] + marks + [("loss", None, t1)]
            names = [f"{p[0]}{'' if p[1] is None else p[1]} -> {q[0]}"
                     f"{'' if q[1] is None else q[1]}" for p, q in zip(points, points[1:])]
            segments[k].append([q[2] - p[2] for p, q in zip(points, points[1:])])
    print(f"fit_block_cost: tiny Llama, {a.rounds} rounds, {a.threads} threads, "
          f"torch {torch.__version__}; medians in us (call: the pre-hook, forward/return: "
          "the layer's own forward, hook: the forward hook)")
    for j, name in enumerate(names):
        p = statistics.median(s[j] for s in segments["plain"]) * 1e6
        f = statistics.median(s[j] for s in segments["fit"]) * 1e6
        print(f"  {name:22s} plain {p:8.1f}  fit {f:8.1f}  fit - plain {f - p:+8.1f}")
    p, f = (statistics.median(sum(x) for x in segments[k]) * 1e3 for k in systems)
    print(f"  forward (start -> loss) plain {p:.2f} ms, fit {f:.2f} ms, fit - plain "
          f"{(f - p) * 1e3:+.0f} us")


if __name__ == "__main__":
    main()
