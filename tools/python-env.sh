#!/usr/bin/env bash
# Makes the Python environment the python-labelled tests run in, and prints its
# interpreter's path. The venv lives outside the checkout, one per requirements file
# content (tests/python/requirements.txt, pinned), so fresh clones share it:
#   ${STASH_VENV_ROOT:-$HOME/.cache/stash}/venv-<sha1 of the requirements>
# pip's own cache makes a rebuild after a change cheap. The python that makes it is
# $STASH_PYTHON, else python3 on PATH (3.9 or newer).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
req="$root/tests/python/requirements.txt"
digest=$(sha1sum "$req" | cut -c1-12)
venv="${STASH_VENV_ROOT:-$HOME/.cache/stash}/venv-$digest"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  py=${STASH_PYTHON:-python3}
  echo "stash: creating the Python test environment $venv (torch and friends: a few GB)" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q --progress-bar off -r "$req" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
