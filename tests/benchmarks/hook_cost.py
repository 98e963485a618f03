"""Host cost per saved tensor of stash's PyTorch saved-tensor hooks (issue 12).

Method. A model of L blocks; block i computes x = tanh(x + b_i) and then N - 1 more
x = tanh(x) on a small fp32 tensor (default 64x64, 16 KiB), so that each block saves
exactly N new tensors for backward (tanh saves its output; the add saves nothing; the
block's input is not saved). N is checked against stash.torch.record. Small tensors make
the per-tensor host overhead dominate the compute. Variants, each on its own deep copy of
one model (identical parameters), hooks installed once before timing and left installed:

  none       no hooks
  keep       stash.torch.offload (its defaults: timing off), every tensor "keep"
  offload    every tensor "offload"; on the CPU test double this includes the double's
             memcpy-based device-to-host and host-to-device copies
  recompute  every tensor the record pass marks recomputable "recompute", the others
             "keep"; here the block's input is not saved, so all N are recomputed and
             the cost includes re-running each block's forward in backward (N tanh)
  checkpoint every block through torch.utils.checkpoint.checkpoint(block, x,
             use_reentrant=False): the same tensors recomputed as 'recompute' (the block's
             input is kept by both), by torch's own replay; the run reports the ratio of
             the two medians (issue 20: stash's replay no slower than checkpoint's)
  save_on_cpu  torch.autograd.graph.save_on_cpu(pin_memory=False) around the forward
             (a CPU tensor's .cpu() is the tensor itself: torch's own hook dispatch)

One sample = forward + loss (sum) + backward of the whole model, timed with
time.perf_counter; gradients are set to None before each sample, outside the timing.
Warm-ups, then repetitions, round-robin over the variants (the starting variant rotates
each round) to cancel drift. Reported: the median per variant, its ratio to the median
without hooks, and the host cost per saved tensor
(median(variant) - median(none)) / (L * N) in microseconds. Every sample's gradients
(the biases') must equal the no-hook gradients bitwise (torch.equal), and the engine's
counters must show that each stash variant did what its plan says; else the script
fails. torch runs with one intra-op thread (the ops are far below its parallel grain
size anyway; this keeps its pool out of the engine's way on a small machine).

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/hook_cost.py [--json PATH]
"""

import argparse
import copy
import json
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint

import stash.torch


class TanhChain(nn.Module):
    """x = tanh(x + b), then n - 1 more x = tanh(x): n saved tensors, one per tanh."""

    def __init__(self, n, size):
        super().__init__()
        self.n = n
        self.b = nn.Parameter(torch.randn(size, size) * 0.1)

    def forward(self, x):
        x = torch.tanh(x + self.b)
        for _ in range(self.n - 1):
            x = torch.tanh(x)
        return x


class Checkpointed(nn.Module):
    """A block run through torch's non-reentrant checkpoint."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)


def _step(blocks, x, ctx):
    for p in blocks.parameters():
        p.grad = None
    t0 = time.perf_counter()
    with ctx():
        y = x
        for b in blocks:
            y = b(y)
    y.sum().backward()
    t1 = time.perf_counter()
    return t1 - t0, [p.grad for p in blocks.parameters()]


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check_grads(name, grads, expected):
    if len(grads) != len(expected) or not all(
            g is not None and torch.equal(g, e) for g, e in zip(grads, expected)):
        sys.exit(f"hook_cost: FAILED: gradients of variant {name!r} differ from the "
                 "no-hook gradients")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8, help="L blocks (default 8)")
    ap.add_argument("--saves", type=int, default=16, help="N saved tensors per block (16)")
    ap.add_argument("--size", type=int, default=64, help="tensors are SIZE x SIZE fp32 (64)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up rounds (5)")
    ap.add_argument("--reps", type=int, default=30, help="measured rounds (30)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    L, N = args.layers, args.saves

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    base = nn.ModuleList([TanhChain(N, args.size) for _ in range(L)])
    x = torch.randn(args.size, args.size)

    # What each block saves, as stash numbers it.
    rec = stash.torch.record(copy.deepcopy(base), x)
    layers = rec["layers"]
    if len(layers) != L or any(len(l["tensors"]) != N for l in layers):
        sys.exit(f"hook_cost: FAILED: record() lists {[len(l['tensors']) for l in layers]} "
                 f"saved tensors per block, expected {N} in each of {L}")
    recompute_plan = [["recompute" if t["recomputable"] else "keep" for t in l["tensors"]]
                      for l in layers]
    n_recompute = sum(a == "recompute" for l in recompute_plan for a in l)

    plans = {"keep": [["keep"] * N for _ in range(L)],
             "offload": [["offload"] * N for _ in range(L)],
             "recompute": recompute_plan}
    # Counters a stash variant must advance per sample: the engine's for offload; the
    # hooks' own for keep and recompute, which never reach the engine (Note [Offload
    # hooks]: its counters must stay at 0 there).
    expect = {"keep": ("hooks.keep_count", L * N), "offload": ("offloaded_count", L * N),
              "recompute": ("hooks.recompute_count", n_recompute)}

    variants = {}  # name -> (blocks, context factory, handle or None)
    variants["none"] = (copy.deepcopy(base), _Null, None)
    handles = []
    try:
        for name, plan in plans.items():
            blocks = copy.deepcopy(base)
            h = stash.torch.offload(blocks, plan)
            handles.append(h)
            variants[name] = (blocks, _Null, h)
        variants["checkpoint"] = (nn.ModuleList(Checkpointed(b) for b in copy.deepcopy(base)),
                                  _Null, None)
        variants["save_on_cpu"] = (
            copy.deepcopy(base),
            lambda: torch.autograd.graph.save_on_cpu(pin_memory=False), None)
        names = list(variants)

        def counter(h, key):
            s = h.stats()
            for k in key.split("."):
                s = s[k]
            return s

        # Reference gradients, and one checked sample of each variant.
        _, expected = _step(variants["none"][0], x, _Null)
        expected = [g.clone() for g in expected]
        for name in names:
            blocks, ctx, h = variants[name]
            before = counter(h, expect[name][0]) if h is not None else 0
            _, grads = _step(blocks, x, ctx)
            _check_grads(name, grads, expected)
            if h is not None:
                got = counter(h, expect[name][0]) - before
                if got != expect[name][1]:
                    sys.exit(f"hook_cost: FAILED: variant {name!r}: {expect[name][0]} "
                             f"advanced by {got} in one sample, expected {expect[name][1]}")
                engine = {k: v for k, v in h.stats().items()
                          if k in ("offloaded_count", "keep_count", "recompute_count",
                                   "released_count")}
                if name != "offload" and any(engine.values()):
                    sys.exit(f"hook_cost: FAILED: variant {name!r} called the engine: {engine}")

        samples = {n: [] for n in names}
        t_start = time.perf_counter()
        for r in range(args.warmup + args.reps):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                blocks, ctx, _ = variants[name]
                dt, grads = _step(blocks, x, ctx)
                _check_grads(name, grads, expected)
                if r >= args.warmup:
                    samples[name].append(dt)
        wall = time.perf_counter() - t_start
        for h in handles:
            s = h.stats()
            if s["failed_count"] or s["pinned"]["failed_count"]:
                sys.exit(f"hook_cost: FAILED: engine reported failures: {s}")
    finally:
        for h in handles:
            h.close()

    saved = L * N
    base_ms = statistics.median(samples["none"]) * 1e3
    rows = []
    for name in names:
        med = statistics.median(samples[name]) * 1e3
        rows.append({
            "variant": name,
            "median_ms": med,
            "min_ms": min(samples[name]) * 1e3,
            "ratio_to_none": med / base_ms,
            "us_per_saved_tensor": None if name == "none" else (med - base_ms) * 1e3 / saved,
        })

    print(f"hook_cost: L={L} blocks x N={N} saved tensors ({args.size}x{args.size} fp32, "
          f"{args.size * args.size * 4} B) = {saved} per forward; {args.reps} samples per "
          f"variant after {args.warmup} warm-up rounds, round-robin; torch {torch.__version__}, "
          f"1 thread; {n_recompute} of {saved} recomputed in 'recompute'; gradients bitwise "
          f"equal to no hooks in every sample; {wall:.1f} s")
    print()
    print("| variant | median fwd+bwd ms | min ms | ratio to no hooks | host cost per saved tensor |")
    print("|---|---|---|---|---|")
    for row in rows:
        per = ("" if row["us_per_saved_tensor"] is None
               else f"{row['us_per_saved_tensor']:+.1f} µs")
        print(f"| {row['variant']} | {row['median_ms']:.3f} | {row['min_ms']:.3f} | "
              f"{row['ratio_to_none']:.2f}x | {per} |")

    ratio = statistics.median(samples["recompute"]) / statistics.median(samples["checkpoint"])
    print()
    print(f"recompute / checkpoint (the same {n_recompute} tensors recomputed): {ratio:.2f}x")

    if args.json:
        out = {"benchmark": "hook_cost", "layers": L, "saves_per_layer": N,
               "tensor_shape": [args.size, args.size], "dtype": "float32",
               "saved_per_forward": saved, "recomputed_per_forward": n_recompute,
               "warmup_rounds": args.warmup, "reps": args.reps, "wall_s": wall,
               "torch": torch.__version__, "python": platform.python_version(),
               "torch_threads": torch.get_num_threads(), "results": rows,
               "recompute_over_checkpoint": ratio,
               "samples_ms": {n: [s * 1e3 for s in samples[n]] for n in names}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
