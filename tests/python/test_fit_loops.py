"""stash.torch.fit through what training loops do besides forward, backward and step
(Note [The loops fit lives in] in stash/torch/_fit_api.py): a step lost to an exception at
every point a step can raise, in a measuring step and in a planned one; eval forwards;
misuse named at fit(). Hugging Face models from small configs (random init, no hub) on
the CPU test double; every comparison is bitwise against plain training that loses the
same steps the same way. Shapes (shares per shape, new lengths): test_fit_shapes.py;
accumulation by hand: test_fit_accumulation.py."""

import warnings

import pytest
import torch
import torch.nn as nn

import stash
import stash.torch

transformers = pytest.importorskip("transformers")
from models import decoder  # noqa: E402

LINK = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
VOCAB = 128


def mistral(seed=0):
    """A family the rest of the suite does not train (sliding-window attention off)."""
    m = decoder("mistral", seed, layers=4, hidden=128, vocab=VOCAB)
    return m, m.model.layers


def trained(budget):
    """A fresh Mistral, its blocks, AdamW over it, and fit at `budget` over its blocks
    (None: plain training, no handle)."""
    model, blocks = mistral()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    h = stash.torch.fit(blocks, budget, optimizer=opt, link=LINK) if budget else None
    return model, blocks, opt, h


def batches(n, batch=2, seq=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(n)]


class Injected(Exception):
    pass


def stack_steps(blocks, opt, shapes):
    """One training step of the stack of blocks per input shape (random inputs)."""
    g = torch.Generator().manual_seed(0)
    for shape in shapes:
        out = torch.randn(*shape, generator=g, requires_grad=True)
        for b in blocks:
            out = b(out)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()


def _raise(kind):
    if kind == "interrupt":
        raise KeyboardInterrupt
    if kind == "oom":
        raise torch.OutOfMemoryError("injected: out of memory")
    raise Injected(kind)


def inject(model, blocks, opt, where, kind, armed):
    """Hooks that raise `kind` at `where` while armed[0] is true."""
    if where == "block":          # inside block 1's forward: the wrapper sees it
        blocks[1].mlp.register_forward_hook(lambda *a: _raise(kind) if armed[0] else None)
    elif where == "between":      # between blocks 1 and 2: nothing of stash's sees it
        blocks[2].register_forward_pre_hook(lambda *a: _raise(kind) if armed[0] else None)
    elif where == "head":         # after the blocks, inside the model's forward
        model.lm_head.register_forward_hook(lambda *a: _raise(kind) if armed[0] else None)
    elif where == "backward":     # halfway through backward: blocks 3 and 2 ran theirs
        def arm_grad(_module, _args, out):
            t = out[0] if isinstance(out, tuple) else out
            if armed[0] and t.requires_grad:
                t.register_hook(lambda g: _raise(kind))
        blocks[1].register_forward_hook(arm_grad)
    elif where == "optimizer":
        opt.register_step_pre_hook(lambda *a: _raise(kind) if armed[0] else None)
    else:
        raise AssertionError(where)


def run(data, where, kind, fail_at, budget=None, check=None, watch=None):
    """AdamW training that loses step `fail_at` to an injected `kind` at `where` (the loop
    catches it, zeroes the gradients and goes on); the losses of the steps that ran, the
    final parameters, and the handle (fit at `budget`, else plain training). check(h, i)
    runs after step i; watch(blocks) once, before the first step."""
    model, blocks, opt, h = trained(budget)
    if watch is not None:
        watch(blocks)
    armed = [False]
    inject(model, blocks, opt, where, kind, armed)
    losses = []
    for i, ids in enumerate(data):
        armed[0] = i == fail_at
        try:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.detach().clone())
        except (Injected, KeyboardInterrupt, torch.OutOfMemoryError):
            assert i == fail_at
            losses.append(None)
        opt.zero_grad()
        if check is not None:
            check(h, i)
    return losses, [p.detach().clone() for p in model.parameters()], h


def nothing_held(h, i, lost_backward=None):
    """After every step, whether it ran or was lost: no engine key, no pinned block. A
    backward that raised is given back when block 0 runs again (Note [A step that ends
    early]): only that step's end is not checked."""
    if i == lost_backward:
        steps = h._offload.hooks.steps
        assert len(steps) == 1 and steps[0].backward_started
        return
    s = h.stats()
    assert s["pinned"]["current_count"] == 0 and s["pinned"]["current_bytes"] == 0, (i, s)
    assert s["in_flight_count"] == 0, (i, s)
    steps = h._offload.hooks.steps
    assert not steps or all(st.backward_started is False and st.next_block == 4
                            for st in steps.values()), i


def same(a, b):
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0]):
        assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), (a[0], b[0])
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


POINTS = [("block", "error"), ("between", "error"), ("head", "error"),
          ("backward", "error"), ("optimizer", "error"), ("block", "interrupt"),
          ("between", "oom")]


@pytest.mark.parametrize("where,kind", POINTS)
@pytest.mark.parametrize("fail_at", [0, 2], ids=["measuring", "planned"])
def test_a_lost_step_leaves_fit_ready(where, kind, fail_at):
    data = batches(5)
    expected = run(data, where, kind, fail_at)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning: a lost step is no misuse
        got = run(data, where, kind, fail_at, budget="85%",
                  check=lambda h, i: nothing_held(
                      h, i, fail_at if where == "backward" else None))
    h = got[2]
    same(got, expected)
    steps = h.report()["steps"]
    lost = [s for s in steps if s["aborted"]]
    assert len(lost) == 1 and lost[0]["step"] == fail_at, steps
    assert not lost[0]["over_budget"]
    if where == "block":  # the record names what the block raised
        named = {"error": "Injected: error", "interrupt": "KeyboardInterrupt"}[kind]
        assert f"block 1's forward raised {named}" in lost[0]["aborted"], lost[0]
    modes = [s["mode"] for s in steps if not s["aborted"]]
    # A lost measuring step is measured again; then every step is planned.
    assert modes == ["measure"] + ["plan"] * (len(modes) - 1), steps
    plan = h.report()["plan"]
    assert plan["actions"]["recompute"] + plan["actions"]["offload"] > 0
    h.close()


@pytest.mark.parametrize("where", ["block", "backward", "optimizer"])
def test_a_plan_that_keeps_everything_marks_one_boundary_and_loses_a_step_cleanly(where):
    # Note [What it costs]: where the plan keeps everything, the blocks run without hooks
    # and only the last block's output carries a backward boundary; a lost step is still
    # given back, and training is still plain training's.
    data = batches(5)
    expected = run(data, where, "error", 2)
    seen, marked = [], []  # per block's output as it returns; per step

    def watch(blocks):
        for b in blocks:
            b.register_forward_hook(
                lambda m, a, out: seen.append(getattr(out, "_stash_marked", False)))

    lean = []  # (step, block) of every block run as a bare call (Note [Lean blocks])

    def check(h, i):
        nothing_held(h, i, 2 if where == "backward" else None)
        marked.append(seen[:])
        seen.clear()
        if i == 0:
            hooks = h._offload.hooks
            bare = hooks._lean_forward

            def counted(j, step, *rest):
                lean.append((len(marked), j))
                return bare(j, step, *rest)
            hooks._lean_forward = counted

    *got, h = run(data, where, "error", 2, budget="1GiB", check=check, watch=watch)
    same(got, expected)
    steps = h.report()["steps"]
    assert [s["aborted"] is not None for s in steps] == [False, False, True, False, False]
    # The planned steps run their middle blocks bare: the lost one up to block 1, which
    # raised there and was given back as the full path gives it back.
    lost = [(2, 1)] if where == "block" else [(2, 1), (2, 2)]
    assert lean == [(1, 1), (1, 2)] + lost + [(3, 1), (3, 2), (4, 1), (4, 2)], lean
    if where == "block":
        assert "block 1's forward raised Injected: error" in steps[2]["aborted"], steps[2]
    assert h.report()["plan"]["actions"]["keep"] > 0
    assert h.report()["plan"]["actions"]["recompute"] == h.report()["plan"]["actions"][
        "offload"] == 0
    assert marked[0] == [True] * 4, marked          # the measuring step marks every block
    for i in (1, 3, 4):                             # planned steps: the last block only
        assert marked[i] == [False, False, False, True], (i, marked)
    h.close()


def test_a_loss_raising_outside_the_model_warns_once_and_recovers():
    """The loss computed by the loop raises while the loop still holds the logits (their
    graph alive): the next forward gives the lost one back, with the warning that names
    micro_batch, and training goes on."""
    data = batches(4)

    def go(budget):
        model, blocks, opt, h = trained(budget)
        losses = []
        for i, ids in enumerate(data):
            try:
                logits = model(input_ids=ids).logits
                if i == 1:
                    raise Injected("loss")
                loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                   ids[:, 1:].flatten())
                loss.backward()
                opt.step()
                losses.append(loss.detach().clone())
            except Injected:
                losses.append(None)
            opt.zero_grad()
        return losses, [p.detach().clone() for p in model.parameters()], h

    expected = go(None)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = go("85%")
    same(got, expected)
    assert sum("micro_batch" in str(w.message) for w in seen) == 1
    assert [s["aborted"] is not None for s in got[2].report()["steps"]] == \
        [False, True, False, False]
    got[2].close()


def test_eval_forwards_neither_warn_nor_measure():
    """Eval in the middle of training (eval mode, with and without grad, no backward):
    no warning, no step of fit's, and the training steps after it stay planned."""
    data = batches(4)
    probe = batches(1, seed=7)[0]

    def go(budget):
        model, blocks, opt, h = trained(budget)
        losses, evals = [], []
        for i, ids in enumerate(data):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().clone())
            if i in (1, 2):
                model.eval()
                evals.append(model(input_ids=probe, labels=probe).loss.detach())  # grad on
                with torch.no_grad():
                    evals.append(model(input_ids=probe, labels=probe).loss)
                model.train()
        return losses + evals, [p.detach().clone() for p in model.parameters()], h

    expected = go(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = go("85%")
    same(got, expected)
    assert [s["mode"] for s in got[2].report()["steps"]] == ["measure", "plan", "plan", "plan"]
    got[2].close()


def test_misuse_is_named():
    model, blocks = mistral()
    with pytest.raises(stash.StashError, match=r"single MistralModel.*\.layers"):
        stash.torch.fit(model.model, "70%")
    with pytest.raises(stash.StashError, match=r"holds the model's repeated blocks \(\.layers\)"):
        stash.torch.fit([model.model], "70%")
    with pytest.raises(stash.StashError, match="ModuleDict"):
        stash.torch.fit(nn.ModuleDict({"a": blocks[0], "b": blocks[1]}), "70%")
    with pytest.raises(stash.StashError, match="block 1 is a str"):
        stash.torch.fit([blocks[0], "layer"], "70%")
    with pytest.raises(stash.StashError, match="not a sequence"):
        stash.torch.fit(3, "70%")
    with pytest.raises(stash.StashError, match="optimizer must be a torch.optim.Optimizer"):
        stash.torch.fit(blocks, "70%", optimizer=model)
    for unitless, hint in (("50", "'50%'"), (70, "'70%'"), ("0.7", "'70%'"), (0.7, "'70%'")):
        with pytest.raises(stash.StashError, match=hint):
            stash.torch.fit(blocks, unitless)
    assert not any("forward" in vars(b) for b in blocks)


def test_the_smallest_feasible_budget_a_refusal_names_is_accepted():
    """Following a refusal's advice works: the named budget is accepted by the same run."""
    import re

    data = batches(3)
    model, blocks = mistral()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    h = stash.torch.fit(blocks, 4 * params, optimizer=opt, link=LINK)
    with pytest.raises(stash.StashError, match="smallest feasible budget") as e:
        for ids in data:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    assert h.engine is None
    smallest = int(re.search(r"smallest feasible budget .*? \((\d+) bytes\)",
                             str(e.value)).group(1))
    model, blocks = mistral()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with stash.torch.fit(blocks, smallest, optimizer=opt, link=LINK) as h:
        for ids in data:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        assert [s["mode"] for s in h.report()["steps"]] == ["measure", "plan", "plan"]


_REFUSED = """
import gc, warnings, weakref
warnings.simplefilter("ignore")
import torch
import stash, stash.torch
from stash.bench import _llama

def refused():
    size = dict(_llama.SIZES["tiny"])
    model = _llama.model(size, 0, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    h = stash.torch.fit(model.model.layers, "30%", optimizer=opt)
    try:
        for ids in _llama.data(size, 3, "cpu"):
            loss = model(input_ids=ids, labels=ids).loss  # the loop keeps its last loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    except stash.StashError as e:
        assert "no plan fits the budget" in str(e), e
    else:
        raise AssertionError("not refused")
    h.close()
    return weakref.ref(model)

model = refused()
gc.collect()
print("model alive:", model() is not None)
"""


def test_a_refused_budget_lets_the_model_go():
    """A refusal raised inside a step, caught, and the model dropped: nothing of stash
    keeps it (or its gradients and optimizer state) alive. The handle once kept the
    exception: its traceback held the loop's frame, the frame the last step's loss, the
    loss's autograd nodes stash's backward hooks, and the hooks the handle, a cycle through
    torch's C++ graph that the garbage collector cannot see. On an H200 each refused row
    of the peers benchmark kept 6.4 GiB. In a process of its own, so that nothing of
    pytest's holds a frame."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _REFUSED], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "model alive: False" in out.stdout, (out.stdout, out.stderr[-3000:])


def test_the_cpu_meter_counts_a_window():
    """Note [The CPU allocator's meter]: blocks allocated before a window opened neither
    count nor uncount; blocks allocated in it count while they live; two windows open at
    once count apart."""
    from stash.torch._cpu_meter import failure, window

    outer, inner = window(), window()
    assert outer is not None, failure()
    before = torch.empty(1 << 20, dtype=torch.uint8)
    outer.reopen()
    del before  # freed in the window, allocated before it: lowers nothing
    a = torch.empty(3 << 20, dtype=torch.uint8)
    inner.reopen()
    b = torch.empty(1 << 20, dtype=torch.uint8)
    del b
    assert outer.peak() == 4 << 20 and inner.peak() == 1 << 20
    inner.reset_peak()
    outer.reset_peak()
    assert outer.peak() == 3 << 20 and inner.peak() == 0
    del a
    assert outer.peak() == 3 << 20
    outer.reopen()
    assert outer.peak() == 0
    outer.close()
    inner.close()


class _Scratchy(nn.Module):
    """A block whose forward uses a 2 MiB scratch tensor it does not save."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        scratch = torch.ones(1 << 19)  # 2 MiB, freed before the forward returns
        return x + torch.tanh(self.fc(x)) + scratch[:1] * 0


def test_a_temporary_fit_does_not_track_is_in_the_budget():
    """The measuring step calibrates the fixed bytes on the CPU allocator's meter, so a
    block's scratch memory is planned for and every step is within the budget on that
    meter (Note [What the budget counts] in _fit_steps.py)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([_Scratchy() for _ in range(4)])
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    with stash.torch.fit(blocks, "90%", optimizer=opt, link=LINK) as h:
        stack_steps(blocks, opt, [(16, 128, 64)] * 4)
        r = h.report()
    assert r["memory"].startswith("c10 CPU allocator")
    counted = sum(p.numel() * 4 * 2 for p in blocks.parameters())  # params and grads
    assert h.profile["fixed_bytes"] >= counted + (2 << 20)
    assert all(not s["over_budget"] and s["measured_peak_bytes"] <= r["budget_bytes"]
               for s in r["steps"]), r["steps"]
    assert all(s["measured_peak_bytes"] >= counted + (2 << 20) for s in r["steps"])


def test_cpu_blocks_on_the_double_without_its_flag_are_refused():
    """A CPU run with STASH_CUDART but without STASHDBL_FOREIGN_IS_DEVICE=1 names it."""
    import os
    import subprocess
    import sys

    code = ("import torch, stash, stash.torch\n"
            "blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])\n"
            "try:\n"
            "    stash.torch.fit(blocks, '1GiB')\n"
            "except stash.StashError as e:\n"
            "    assert 'forward' not in vars(blocks[0])\n"
            "    print('refused:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "STASHDBL_FOREIGN_IS_DEVICE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "STASHDBL_FOREIGN_IS_DEVICE=1" in out.stdout, out.stdout
