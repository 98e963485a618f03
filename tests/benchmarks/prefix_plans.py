"""Plans of one measured profile, recompute priced as a replayed prefix against the
per-tensor plan with each prefix closed afterwards (what stash.torch.fit did before the
planner knew prefixes: Note [Recompute by prefix] in planner/model/plan.h).

Method. The peers' tiny Llama (stash.bench._llama, or --size) is measured by fit on the
CPU test double (three AdamW steps at 100%); its profile is planned at each share with
"recompute_cost": "prefix", and again without it, each layer's recompute then closed to
a prefix as fit used to. Both plans are priced by evaluate() on the prefix profile (what
the replay pays) and printed with their keep/recompute/offload counts. The figures are
the model's, not timed steps: the profile's times are this run's measurement.

Run with stash's libraries on the CPU test double (tests/python's environment):
  STASH_CUDART=build/cudart_double/libcudart.so.13 STASHDBL_FOREIGN_IS_DEVICE=1 \\
  STASH_LIB_DIR=build/bindings:build/bindings/torch_alloc PYTHONPATH=bindings/python \\
  python tests/benchmarks/prefix_plans.py [--size tiny] [--shares 50,60,70,80,90,95]
"""

import argparse
from typing import Any, Dict

import torch

import stash.torch
from stash._planner import evaluate, make_plan
from stash.bench import _llama
from stash.torch._fit_support import _plan_doc


def closed(doc: Dict[str, Any], plan: Dict[str, Any]) -> Dict[str, Any]:
    """Every recomputable tensor before a layer's last recomputed one recomputed too."""
    for li, layer in enumerate(plan["layers"]):
        ts = layer["tensors"]
        prof = doc["layers"][li]["tensors"]
        rec = [j for j, t in enumerate(ts) if t["action"] == "recompute"]
        for j in range(max(rec) if rec else 0):
            if prof[j]["recomputable"]:
                ts[j]["action"] = "recompute"
    return plan


def counts(plan: Dict[str, Any]) -> str:
    acts = [t["action"] for layer in plan["layers"] for t in layer["tensors"]]
    return "/".join(str(acts.count(a)) for a in ("keep", "recompute", "offload"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="tiny", choices=sorted(_llama.SIZES))
    ap.add_argument("--shares", default="50,60,70,80,90,95")
    a = ap.parse_args()
    size = dict(_llama.SIZES[a.size])
    model = _llama.model(size, 0, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    link = {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
    with stash.torch.fit(model.model.layers, "100%", optimizer=opt, link=link) as h:
        for ids in _llama.data(size, 3, "cpu"):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
        doc = h.profile
    assert doc is not None, "fit measured nothing"
    prefix = dict(doc, recompute_cost="prefix")
    each = {k: v for k, v in doc.items() if k != "recompute_cost"}
    keep = _plan_doc(prefix, [["keep"] * len(layer["tensors"]) for layer in doc["layers"]])
    ka = evaluate(prefix, keep, 1 << 62, strict=False)
    print(f"keep-all: peak {ka['predicted_peak_bytes']} bytes, step "
          f"{ka['predicted_step_ms']:.2f} ms")
    print("| budget | prefix plan | k/r/o | closed per-tensor plan | k/r/o |")
    print("|---|---|---|---|---|")
    for share in a.shares.split(","):
        new, figures = make_plan(prefix, f"{share}%")
        old = closed(doc, make_plan(each, f"{share}%")[0])
        priced = evaluate(prefix, old, figures["budget_bytes"])
        print(f"| {share}% | {figures['predicted_step_ms']:.1f} ms | {counts(new)} | "
              f"{priced['predicted_step_ms']:.1f} ms | {counts(old)} |")


if __name__ == "__main__":
    main()
