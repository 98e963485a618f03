"""The installed package: what `pip install bindings/python` gives a user (libraries inside
the wheel, type information), and the ctypes mirrors of stash.h checked field by field
against the header as a C compiler lays it out (tests/python/struct_layout.c)."""

import ctypes
import importlib
import json
import os
import subprocess

import pytest

import stash
from stash import _engine, _lib, _link, _planner


def test_libraries_come_from_the_package_without_stash_lib_dir():
    if os.environ.get("STASH_TEST_INSTALLED") != "1":
        pytest.skip("the tests run from the source tree, not an installed wheel")
    assert "STASH_LIB_DIR" not in os.environ and "PYTHONPATH" not in os.environ
    pkg = os.path.dirname(os.path.abspath(stash.__file__))
    assert "site-packages" in pkg
    for name in ("libstash.so", "libstash_torch.so"):
        assert _lib.find_library(name) == os.path.join(pkg, "lib", name)
    assert os.path.isfile(os.path.join(pkg, "py.typed"))
    importlib.import_module("stash.torch")  # works with nothing set but the test runtime
    assert stash.version() == stash.__version__


def _layout():
    exe = os.environ.get("STASH_STRUCT_LAYOUT")
    if not exe:
        pytest.skip("STASH_STRUCT_LAYOUT (tests/python/struct_layout.c's binary) is not set")
    return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


MIRRORS = {
    "stash_pool_stats_t": _lib.PoolStats,
    "stash_engine_config_t": _engine.EngineConfig,
    "stash_engine_stats_t": _engine.EngineStats,
    "stash_tensor_key_t": _engine.TensorKey,
    "stash_overlap_t": _engine.Overlap,
    "stash_plan_options_t": _planner.PlanOptions,
    "stash_plan_result_t": _planner.PlanResult,
    "stash_link_result_t": _link.LinkResult,
}


@pytest.mark.parametrize("c_name", sorted(MIRRORS))
def test_ctypes_mirror_matches_the_header(c_name):
    want = _layout()["structs"][c_name]
    mirror = MIRRORS[c_name]
    assert ctypes.sizeof(mirror) == want["size"], c_name
    got = {name: [getattr(mirror, name).offset, getattr(mirror, name).size]
           for name, *_ in mirror._fields_}
    assert got == want["fields"], c_name


def test_enum_values_match_the_header():
    e = _layout()["enums"]
    assert (_engine.KEEP, _engine.RECOMPUTE, _engine.OFFLOAD) == (
        e["STASH_ACTION_KEEP"], e["STASH_ACTION_RECOMPUTE"], e["STASH_ACTION_OFFLOAD"])
    assert _planner.SOLVERS == {"greedy": e["STASH_SOLVER_GREEDY"], "ilp": e["STASH_SOLVER_ILP"],
                                "exact": e["STASH_SOLVER_EXACT"]}
    assert _engine.STASH_ERROR_UNKNOWN_TENSOR == e["STASH_ERROR_UNKNOWN_TENSOR"]
    assert _engine.STASH_ERROR_BAD_PLAN == e["STASH_ERROR_BAD_PLAN"]
    assert _planner.STASH_ERROR_BAD_PROFILE == e["STASH_ERROR_BAD_PROFILE"]
    assert _planner.STASH_ERROR_INFEASIBLE_BUDGET == e["STASH_ERROR_INFEASIBLE_BUDGET"]
    assert _engine.STATE_NAMES[e["STASH_TENSOR_RELEASED"]] == "released"
    assert _engine.STATE_NAMES[e["STASH_TENSOR_READY"]] == "ready"


def test_planner_through_the_c_api():
    here = os.path.dirname(os.path.abspath(__file__))
    profile = os.path.join(here, "..", "..", "tools", "demo", "profiles",
                           "llama3-8b_h200_b4_s4096.json")
    with open(profile) as f:
        text = f.read()
    plan, figures = _planner.make_plan(text, "70%")
    assert plan["schema"] == "stash.plan/1"
    assert figures["predicted_peak_bytes"] <= figures["budget_bytes"]
    assert figures["budget_bytes"] == int(0.7 * figures["keep_all_peak_bytes"]) or \
        abs(figures["budget_bytes"] - 0.7 * figures["keep_all_peak_bytes"]) < 2
    again = _planner.evaluate(text, plan)
    assert again["predicted_peak_bytes"] == figures["predicted_peak_bytes"]
    with pytest.raises(_planner.InfeasibleBudget) as e:
        _planner.make_plan(text, "10%")
    assert e.value.min_feasible_bytes > e.value.budget_bytes
    assert "GiB" in str(e.value)
    with pytest.raises(stash.StashError, match="parsecs"):
        _planner.make_plan(text, "7 parsecs")
    with pytest.raises(ValueError, match="solver"):
        _planner.make_plan(text, "70%", solver="magic")


def test_parse_bytes_is_libstashs():
    # libstash owns the syntax (stash_parse_bytes); Python passes ints and the C message.
    assert stash.parse_bytes("0.1GB") == 100_000_000  # exact, not a float
    assert stash.parse_bytes(" 1.5 tib ") == 3 << 39
    assert stash.parse_bytes("1.0005KiB") == 1024  # truncated, never rounded up
    assert stash.parse_bytes("18446744073709551615") == 2**64 - 1
    assert stash.parse_bytes(2**70) == 2**70  # an int is not the C function's to judge
    assert stash.parse_bytes(0) == 0
    with pytest.raises(ValueError, match=r'^stash_parse_bytes: byte count "8G": unknown unit '
                       r'"G" \(use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB\)$'):
        stash.parse_bytes("8G")
    for bad, why in (("1.5", "a bare byte count must be an integer"),
                     ("18446744073709551616", "too large"), ("8 GiB x", "trailing"),
                     ("", "expected a number"), ("1e9", "unknown unit")):
        with pytest.raises(ValueError, match=why):
            stash.parse_bytes(bad)
    for bad in (True, False, -1, "8GiB\0junk", 1.5, None):
        with pytest.raises(ValueError, match="byte count"):
            stash.parse_bytes(bad)  # type: ignore[arg-type]


def test_profile_validate_is_the_planners():
    # libstash's reader (stash_profile_validate) judges the profile; Python adds no rule.
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "tools", "demo", "profiles",
                           "llama3-8b_h200_b4_s4096.json")
    with open(path) as f:
        doc = json.load(f)
    assert stash.profile.validate(doc) is doc
    bad = json.loads(json.dumps(doc))
    bad["layers"][0]["tensors"][0]["bytes"] = 1.5  # the planner's rule: whole bytes
    with pytest.raises(stash.profile.ProfileError, match=r"^stash_profile_validate: "
                       r"layers\[0\]\.tensors\[0\]\.bytes: must be a non-negative integer"):
        stash.profile.validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["fixed_bytes"] = 2**60  # the planner's rule too: sizes stay below 2^53
    with pytest.raises(stash.profile.ProfileError, match=r"fixed_bytes: exceeds 2\^53"):
        stash.profile.validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["layers"][0]["fwd_ms"] = float("nan")
    with pytest.raises(stash.profile.ProfileError, match="not JSON"):
        stash.profile.validate(bad)
    bad["layers"][0]["fwd_ms"] = object()
    with pytest.raises(stash.profile.ProfileError, match="not JSON"):
        stash.profile.validate(bad)
    with pytest.raises(stash.profile.ProfileError, match="a profile is a JSON object"):
        stash.profile.validate([doc])  # type: ignore[arg-type]
    assert issubclass(stash.profile.ProfileError, ValueError)


def test_plans_are_read_by_the_library(tmp_path):
    # Note [One plan reader]: plan_actions reads through stash_plan_read_actions, the
    # engine's reader, and takes the action numbers from the library.
    _engine._check_actions(_engine._lib())
    plan = {"schema": "stash.plan/1", "layers": [
        {"index": 0, "tensors": [{"name": "x", "action": "offload"}, {"action": "keep"}]},
        {"tensors": []}, {"tensors": [{"action": "recompute"}]}]}
    want = [[_engine.OFFLOAD, _engine.KEEP], [], [_engine.RECOMPUTE]]
    assert _engine.plan_actions(plan) == want
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert _engine.plan_actions(str(path)) == want
    assert _engine.plan_actions(path) == want
    plan["layers"][2]["tensors"][0]["action"] = "evict"
    with pytest.raises(stash.StashError,
                       match=r"^plan: layers\[2\]\.tensors\[0\]\.action: unknown action") as e:
        _engine.plan_actions(plan)
    assert e.value.status == _engine.STASH_ERROR_BAD_PLAN
    path.write_text(json.dumps(plan))
    with pytest.raises(stash.StashError, match=r"plan\.json: layers\[2\]\.tensors\[0\]\.action"):
        _engine.plan_actions(path)
    path.write_text("{not json")
    with pytest.raises(stash.StashError, match=r"plan\.json: the plan is not JSON"):
        _engine.plan_actions(path)
    with pytest.raises(stash.StashError, match="cannot read plan"):
        _engine.plan_actions(tmp_path / "missing.json")
    with pytest.raises(stash.StashError, match=r"plan: schema: unsupported plan schema"):
        _engine.plan_actions({"schema": "stash.plan/0", "layers": []})
