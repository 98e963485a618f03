"""`python -m stash.bench.peers`: stash against the memory tools PyTorch users already run,
on a Hugging Face Llama, in one process: one table, one JSON file, one Pareto plot.

Every system trains the same model (LlamaForCausalLM from a config, the same seed, SDPA)
on the same batches with AdamW, for --steps steps:
  keep-all            plain training
  full-ac             torch.utils.checkpoint per decoder layer, non-reentrant
  sac                 selective checkpointing with torchtitan's op policy
                      (create_selective_checkpoint_contexts; Note [Selective checkpointing,
                      torchtitan's op policy] in _peer_systems.py)
  save_on_cpu         torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward
  torchtune           torchtune.training.OffloadActivations(use_streams=True), the real
                      package, around the forward
  compile-B           per-layer torch.compile with activation_memory_budget B (0.3, 0.5, 0.7)
  stash@...           stash.torch.fit over the decoder layers at every peer's measured
                      peak (keep-all's too), then at --shares of keep-all's (85%, 70%, 55%)
  stash+compile@...   the same over the layers compiled (layer.compile()), at each
                      compile-B row's peak: stash's plan against torch's, both compiled
  compile-whole       the whole model under torch.compile (model.compile()), no budget
  compile-offload     the whole model compiled with torch's activation offloading pass,
                      every saved value it can move offloaded (CUDA only; Note [torch's
                      own offloading pass] in _peer_systems.py)
  stash+whole@...     fit over the layers of the model compiled whole, at each compile-B
                      row's and compile-offload's peak and at --shares of compile-whole's:
                      stash plans the compiled graph's saved values (Note [Planning the
                      compiled graph] in stash/torch/_compiled.py)
For each: the measured peak (Note [One meter for every row] in _meter.py), tokens/s (the
median step after the warm-up), the losses against keep-all's (bitwise for the eager
systems; within a relative tolerance for compiled ones, Note [Which losses must match] in
_peers_table.py), and for stash the predicted step time and peak. Writes peers.md,
peers.json and peers.svg (throughput against peak; Note [The knee of stash's curve] in
_svg.py).

  python -m stash.bench.peers --size tiny --out out/peers     # CPU (stash's test double)
  python -m stash.bench.peers --size h200 --out out/peers     # one GPU, bf16

Note [Ratios from interleaved steps]
This machine's speed drifts by tens of percent between and within runs, so tokens/s taken
from one system's steps, then the next system's, compares moments as much as systems.
With --interleave N (the default on the CPU: 48) every row that ran is trained again side
by side: one model per system, one step of each in turn, the order rotating each round,
two untimed rounds then N timed ones, less any step that compiled a graph (a compiled
row's first steps; a whole-model stash row's measuring and planning steps). The table's
tokens/s, and every ratio in it, are the medians of those steps; the sequential pass
still gives the peaks, the budgets and the losses (its own tokens/s stay in the JSON as
sequential_tokens_per_s). Compiled rows are interleaved too, each compiling through a
backend of its own (Note [A compile backend per system] in _peer_systems.py);
--no-interleave-compiled leaves them their sequential figure, which is a few steps at
most after their compiles: stash compiled whole at compile-0.7's peak read 78.3% of
compile-0.7 from 3 sequential steps, and 87.4% from 48 interleaved rounds (BENCHMARKS.md,
"Compiled peers side by side").
The default was 12 rounds, too few for a ratio of 1%: three tiny runs back to back
(full-ac and sac beside keep-all) put stash at keep-all's peak at 96.9%, 100.6% and
95.9% of keep-all, and full AC's row at 104.1%, 107.4% and 95.1% of full AC; with 48
rounds, 100.5%, 100.8%, 99.8% and 105.5-106.2% (BENCHMARKS.md, 2026-12-07).

Note [Rows that say why]
A system that cannot run here (not installed, a torch without the feature, needs CUDA)
keeps its row, status "unavailable" and the reason; one that starts but fails in training
is "failed", its exception in the row and its traceback on stderr. No row is dropped,
and a failed peer gives stash no budget to run at. stash's own rows fail the command
(exit 1) when they do not run, or, on CUDA, when a step's peak is over the budget.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import statistics
import sys
import time
import traceback
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _llama
from .._lib import StashError
from ..torch._fit_support import _compile_events
from ..torch._meter import Meter, meter_for
from ._peer_systems import (Session, System, decoder_layers, peer_systems, stash_systems,
                            system_by_name)
from ._peers_table import finish_stash_rows, gib, loss_check, stash_summary, table
from ._svg import knee, peers_svg, stash_curve

if TYPE_CHECKING:  # for the hints only: the functions import torch when they run
    import torch
    from torch.utils.hooks import RemovableHandle
    from transformers import LlamaForCausalLM

    from ._llama import Device

def _row(system: System) -> Dict[str, Any]:
    r = system.describe()
    r.update(status="ok", reason=None, peak_bytes=None, reserved_bytes=None,
             tokens_per_s=None, median_step_ms=None, steps=[], losses=[])
    return r


def _sync(device: Device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _train_step(model: LlamaForCausalLM, opt: torch.optim.Optimizer, session: Session,
                ids: torch.Tensor, device: Device) -> Tuple[torch.Tensor, float]:
    """One training step as every system runs it: forward under the system's session, loss,
    backward, optimizer step, gradients to None; its loss and wall time in ms (the device
    synchronized before and after)."""
    _sync(device)
    t0 = time.perf_counter()
    with session.forward():
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    _sync(device)
    return loss, (time.perf_counter() - t0) * 1e3


class InjectedFault(Exception):
    """The exception run_system's fault_at raises in a block's forward."""


def _raise_injected(module: torch.nn.Module, args: Tuple[Any, ...]) -> None:
    raise InjectedFault("stash.bench: an injected fault in a block's forward")


def run_system(system: System, size: Dict[str, Any], batches: List[torch.Tensor],
               device: Device, meter: Meter, warmup: int,
               fault_at: Optional[int] = None) -> Dict[str, Any]:
    """Trains a fresh model under system for len(batches) steps; its row. fault_at: the
    step whose forward raises in the second decoder layer (InjectedFault); the loop
    catches it and goes on, as a training loop that skips a bad batch does (the step is
    recorded lost, its loss None)."""
    import torch

    row = _row(system)
    meter.begin_run()
    model: Optional[LlamaForCausalLM] = None
    opt: Optional[torch.optim.Optimizer] = None
    session: Optional[Session] = None
    try:
        model = _llama.model(size, 0, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        try:
            session = system.start(model, opt, device)
        except Exception as e:  # Note [Rows that say why]
            row.update(status="unavailable", reason=f"{type(e).__name__}: {e}")
            return row
        torch.manual_seed(1234)
        n = len(batches)
        for i, ids in enumerate(batches):
            fault: Optional[RemovableHandle] = None
            if i == fault_at:
                layers = decoder_layers(model)
                fault = layers[min(1, len(layers) - 1)].register_forward_pre_hook(
                    _raise_injected)
            compiles = _compile_events()
            try:
                with meter.step(i, n, model, opt, ids):
                    loss, ms = _train_step(model, opt, session, ids, device)
            except InjectedFault:
                opt.zero_grad(set_to_none=True)
                row["losses"].append(None)
                row["steps"].append({"wall_ms": None, "metered": meter.watches(i, n),
                                     "lost": True, "tokens": int(ids.numel())})
                continue
            finally:
                if fault is not None:
                    fault.remove()
            row["losses"].append(loss.item())
            row["steps"].append({"wall_ms": ms, "metered": meter.watches(i, n),
                                 "tokens": int(ids.numel()),
                                 "compiles": _compile_events() - compiles,
                                 **{f"{k}_bytes": v for k, v in meter.last.items()}})
        report = session.stash_report()
    except Exception as e:
        row.update(status="failed", reason=f"{type(e).__name__}: {e}")
        # fit's refusal of a budget below what the model can be trained in: a result.
        row["infeasible"] = isinstance(e, StashError) and "smallest feasible budget" in str(e)
        if not row["infeasible"]:
            print(f"stash.bench.peers: {system.name} failed:", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
        return row
    finally:
        if session is not None:
            try:
                session.close()
            except Exception as e:  # a failure to undo is the row's, not the run's
                if row["status"] == "ok":
                    row.update(status="failed", reason=f"close: {type(e).__name__}: {e}")
        del model, opt, session
        gc.collect()

    if report is not None:
        for s, r in zip(row["steps"], report["steps"]):
            s.update(mode=r["mode"], fit_peak_bytes=r["measured_peak_bytes"],
                     predicted_peak_bytes=r["predicted_peak_bytes"], step_ms=r["step_ms"],
                     predicted_step_ms=r["predicted_step_ms"],
                     step_budget_bytes=r.get("budget_bytes"), check=r.get("check"))
    done = [s for s in row["steps"] if not s.get("lost")]
    timed = [s for i, s in enumerate(row["steps"])
             if i >= warmup and not s["metered"] and not s.get("lost")
             and s.get("mode", "plan") == "plan" and not s.get("compiles")]
    if not timed:
        timed = [s for s in done if not s["metered"]][-1:] or done[-1:]
        row["timing_note"] = "no step after the warm-up: timed the last unmetered step"
    row["median_step_ms"] = statistics.median(s["wall_ms"] for s in timed)
    row["timed_steps"] = len(timed)
    if len({s["tokens"] for s in timed}) == 1:
        row["tokens_per_s"] = timed[0]["tokens"] / (row["median_step_ms"] / 1e3)
    else:  # lengths that vary: the timed steps' tokens over their time
        row["tokens_per_s"] = (sum(s["tokens"] for s in timed)
                               / (sum(s["wall_ms"] for s in timed) / 1e3))
    row["peak_bytes"] = meter.allocated
    row["reserved_bytes"] = meter.reserved
    if report is not None:
        row["stash"] = stash_summary(report, row["steps"])
    return row


def time_interleaved(systems: List[System], size: Dict[str, Any], device: Device,
                     steps: int, warmup: int) -> Dict[str, List[float]]:
    """Note [Ratios from interleaved steps]: every system's model trained side by side,
    one step each in turn (the order rotating), `warmup` untimed rounds then `steps` timed
    ones; each system's step times in ms, less its steps that compiled a graph."""
    import torch
    import torch._dynamo

    batches = _llama.data(size, warmup + steps, device)
    runs: List[Tuple[System, LlamaForCausalLM, torch.optim.AdamW, Session]] = []
    # Every compiled system's graphs at once: Dynamo's limit of 8 graphs per code object
    # would send the rest to eager mode (a whole-model stash row alone compiles two or
    # three: the measuring graph, its plan's, a corrected plan's).
    limits = torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=1024)
    try:
        with limits:
            for system in systems:
                model = _llama.model(size, 0, device)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
                runs.append((system, model, opt, system.start(model, opt, device)))
            times: Dict[str, List[float]] = {s.name: [] for s in systems}
            for k, ids in enumerate(batches):
                turn = k % len(runs)
                for system, model, opt, session in runs[turn:] + runs[:turn]:
                    compiles = _compile_events()
                    _, ms = _train_step(model, opt, session, ids, device)
                    if k >= warmup and _compile_events() == compiles:
                        times[system.name].append(ms)
            return times
    finally:
        for _, _, _, session in runs:
            session.close()
        del runs
        gc.collect()


def _write(out_dir: str, doc: Dict[str, Any]) -> None:
    from stash.profile import write_json

    write_json(os.path.join(out_dir, "peers.json"), doc)


def _parse_list(text: str, what: str) -> List[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"stash.bench.peers: {what} must be comma-separated numbers, "
                         f"got {text!r}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m stash.bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(_llama.SIZES) + ["auto"], default="tiny",
                    help="the Llama (auto: the largest this device holds)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the size's)")
    ap.add_argument("--steps", type=int, default=6, help="training steps per system")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps at the start")
    ap.add_argument("--shares", default="85,70,55", help="stash budgets, %% of keep-all")
    ap.add_argument("--compile-budgets", default="0.3,0.5,0.7",
                    help="activation_memory_budget values for torch.compile ('' for none)")
    ap.add_argument("--systems", default="",
                    help="peers to run, comma-separated names (default all; keep-all "
                         "always runs): full-ac, sac, save_on_cpu, torchtune, compile-B, "
                         "compile-whole, compile-offload")
    ap.add_argument("--no-stash", action="store_true", help="the peers only")
    ap.add_argument("--out", default="out/peers", help="folder for peers.{md,json,svg}")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--interleave", type=int, default=None,
                    help="timed rounds of every row side by side (Note [Ratios from "
                         "interleaved steps]; default 48 on the CPU, 0 on CUDA)")
    ap.add_argument("--interleave-compiled", action=argparse.BooleanOptionalAction,
                    default=True, help="compiled rows in the interleaved rounds too")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.warmup < 0 or a.warmup >= a.steps:
        ap.error("--steps must be at least 2 and --warmup smaller than --steps")

    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    cuda = device == "cuda"
    if a.size == "auto":
        a.size = _llama.size_for(device)
    size = dict(_llama.SIZES[a.size])
    if a.layers:
        size["layers"] = a.layers
    shares = _parse_list(a.shares, "--shares")
    peers = peer_systems(_parse_list(a.compile_budgets, "--compile-budgets"))
    names = [n.strip() for n in a.systems.split(",") if n.strip()]
    try:
        peers = system_by_name(peers, ["keep-all"] + names if names else None)
    except ValueError as e:
        ap.error(str(e))
    os.makedirs(a.out, exist_ok=True)
    batches = _llama.data(size, a.steps, device)
    meter = meter_for(device)
    # On the CPU double the link is the double's; on a GPU fit measures it (cached).
    link = None if cuda else {"h2d_gbps": 20.0, "d2h_gbps": 20.0, "bidir_gbps": 32.0}
    doc: Dict[str, Any] = {
        "size": a.size, "config": size, "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "steps": a.steps, "warmup": a.warmup,
        "meter": meter.source, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": []}
    for package in ("transformers", "torchtune", "torchao"):
        try:
            doc[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            doc[package] = None
    print(f"stash.bench.peers: {a.size} Llama {size}, {a.steps} steps per system on {device}; "
          f"meter: {meter.source}", flush=True)

    rows: List[Dict[str, Any]] = doc["rows"]

    def write_outputs(quiet: bool) -> str:
        """The table, JSON and plot of the rows so far: after every row, so a run cut
        short keeps what it measured."""
        keep = next((r for r in rows if r["kind"] == "keep-all"), None)
        ref = keep["losses"] if keep and keep["status"] == "ok" else []
        for r in rows:
            if r["status"] == "ok" and r["kind"] != "keep-all":
                r["loss_check"] = loss_check(r["losses"], ref, r["compiled"], size["dtype"])
        finish_stash_rows(rows, cuda)
        k = knee(stash_curve(rows))
        doc["stash_knee"] = ({"peak_gib": k[0], "tokens_per_s": k[1]} if k is not None
                             else None)
        md = table(rows)
        _write(a.out, doc)
        with open(os.path.join(a.out, "peers.md"), "w") as f:
            f.write(f"{a.size} Llama on {doc['device_name']}, torch {doc['torch']}, "
                    f"{a.steps} steps ({a.warmup} warm-up); peak meter: {meter.source}"
                    + (f"; tokens/s: medians of {doc['interleave']} interleaved rounds"
                       if doc.get("interleave") else "") + "\n\n"
                    f"{md}\n")
        title = (f"Peers on a Llama ({size['layers']} layers, hidden {size['hidden']}, "
                 f"seq {size['seq']}, {size['dtype']})")
        sub = f"{doc['device_name']}, torch {doc['torch']}; peak: {meter.source.split(',')[0]}"
        try:
            svg = peers_svg(rows, title, sub)
        except ValueError as e:  # nothing ran yet, or nothing that has a peak
            if not quiet:
                print(f"stash.bench.peers: no plot: {e}", file=sys.stderr)
        else:
            with open(os.path.join(a.out, "peers.svg"), "w") as f:
                f.write(svg)
        return md

    def run(system: System) -> None:
        t0 = time.perf_counter()
        print(f"  {system.label} ...", end="", flush=True)
        r = run_system(system, size, batches, device, meter, a.warmup)
        r["wall_s"] = time.perf_counter() - t0
        rows.append(r)
        if r["status"] == "ok":
            print(f" peak {gib(r['peak_bytes'])} GiB, {r['tokens_per_s']:.0f} tokens/s "
                  f"({r['wall_s']:.1f} s)", flush=True)
        else:
            print(f" {r['status']}: {r['reason']}", flush=True)
        write_outputs(quiet=True)

    all_systems: List[System] = list(peers)
    for s in peers:
        run(s)
    if not a.no_stash:
        for s in stash_systems(rows, shares, link=link):
            all_systems.append(s)
            run(s)
    rounds = a.interleave if a.interleave is not None else (0 if cuda else 48)
    if rounds > 0:
        ran = {r["name"]: r for r in rows
               if r["status"] == "ok" and (a.interleave_compiled or not r["compiled"])}
        chosen = [s for s in all_systems if s.name in ran]
        print(f"  interleaved: {len(chosen)} systems, {rounds} rounds ...", end="", flush=True)
        t0 = time.perf_counter()
        times = time_interleaved(chosen, size, device, rounds, 2)
        for name, ms in times.items():
            r = ran[name]
            if not ms:  # every round compiled: the sequential figure stays
                continue
            r["sequential_tokens_per_s"] = r["tokens_per_s"]
            r["median_step_ms"] = statistics.median(ms)
            r["timed_steps"] = len(ms)
            r["interleaved"] = True
            r["tokens_per_s"] = size["batch"] * size["seq"] / (r["median_step_ms"] / 1e3)
        doc["interleave"] = rounds
        print(f" {time.perf_counter() - t0:.1f} s", flush=True)
    md = write_outputs(quiet=False)
    print(md)
    print(f"wrote {a.out}/peers.md, peers.json, peers.svg", flush=True)

    bad = [r["label"] for r in rows if r["kind"] == "stash"
           and (r["status"] != "ok" and not r.get("infeasible")
                or (cuda and r["status"] == "ok" and not r["within_budget"]))]
    if bad:
        print(f"stash.bench.peers: stash rows that failed or went over budget: "
              f"{'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
