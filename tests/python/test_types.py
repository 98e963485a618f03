"""The type checker over the package (issue 22: full type hints, a checker in the suite):
mypy with bindings/python/pyproject.toml's [tool.mypy], which checks all of stash/ and
holds all of it to mypy's strict flags. Run on the source tree, not
the installed wheel: the hints are the source's."""

import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "bindings" / "python"
CONFIG = PACKAGE / "pyproject.toml"


def mypy(*args, cwd=PACKAGE):
    """mypy (pinned in tests/python/requirements.txt) with the package's configuration."""
    env = dict(os.environ, MYPY_CACHE_DIR=os.devnull)  # nothing written into the tree
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(CONFIG),
                           "--no-error-summary", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_package_type_checks():
    r = mypy()
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_strict_module_with_an_untyped_function_fails(tmp_path):
    """Strict is in force: a planted module under one of the package's names, with a
    function that has no hints, fails the check."""
    pkg = tmp_path / "stash" / "torch"
    pkg.mkdir(parents=True)
    (tmp_path / "stash" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "_fit_cache.py").write_text("def entry(key):\n    return {'key': key}\n")
    r = mypy(str(pkg / "_fit_cache.py"), cwd=tmp_path)
    assert r.returncode != 0 and "no-untyped-def" in r.stdout, r.stdout + r.stderr
