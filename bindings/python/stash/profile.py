"""stash.profile/1 documents in Python: the fields, and a structural check.

The planner (planner/model/profile.cpp) is the authority on the schema: :func:`validate` hands
the document to libstash's stash_profile_validate (stash.h, "Planner"), the reader that
``stash plan`` and stash_plan_make use, so that a profile written from Python is known to
load there before it gets there.
"""

import ctypes
import json
import os
from typing import Any, Dict, Union

from ._lib import load

SCHEMA = "stash.profile/1"

__all__ = ["SCHEMA", "validate", "write_json", "ProfileError"]


def write_json(path: Union[str, "os.PathLike[str]"], doc: Any) -> None:
    """Writes `doc` as JSON to `path` whole or not at all (a temporary file, then a rename;
    the folder is made if missing), as planner::write_json_file does for the CLI."""
    path = os.fspath(path)
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


class ProfileError(ValueError):
    """A profile that is not valid stash.profile/1; the message names the field."""


def _lib() -> ctypes.CDLL:
    lib = load("libstash.so")
    if not getattr(lib, "_stash_profile_typed", False):
        lib.stash_profile_validate.argtypes = [ctypes.c_char_p]
        lib.stash_profile_validate.restype = ctypes.c_int
        lib.stash_last_error.argtypes = []
        lib.stash_last_error.restype = ctypes.c_char_p
        setattr(lib, "_stash_profile_typed", True)
    return lib


def validate(doc: Dict[str, Any]) -> Dict[str, Any]:
    """Raises ProfileError unless ``doc`` (a dict) is valid stash.profile/1 as the planner
    reads it (stash_profile_validate): every field it requires, of the right type and range,
    at least one layer, unique tensor names per layer. The message names the first bad field
    by its JSON path ("layers[0].tensors[1].name: duplicate tensor name ..."). Returns
    ``doc``."""
    if not isinstance(doc, dict):
        raise ProfileError(f"<root>: a profile is a JSON object, got {type(doc).__name__}")
    try:
        text = json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as e:  # a value JSON cannot hold: a tensor, NaN
        raise ProfileError(f"the profile is not JSON: {e}") from None
    lib = _lib()
    if lib.stash_profile_validate(text.encode()) != 0:
        raise ProfileError(lib.stash_last_error().decode(errors="replace"))
    return doc
