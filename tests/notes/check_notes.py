#!/usr/bin/env python3
"""Every `Note [<name>]` reference in the tree resolves to a Note (CONTRIBUTING.md).

A Note is defined by a line that, less its comment marker (//, #, *, a docstring's
indentation), starts with `Note [<name>]`, alone or followed by a colon. A reference is
`Note [<name>]` anywhere, wrapped over lines or not; C and C++ string literals split over
lines are joined first. `Note [...]` stands for Notes in general, and a name in angle
brackets for any name: neither is a reference. Usage: check_notes.py [ROOT] (default: the repository of this
file); exit 1 with each dangling reference listed, 0 otherwise, 77 outside a git
checkout."""

import os
import re
import subprocess
import sys

EXTENSIONS = (".py", ".h", ".hpp", ".c", ".cpp", ".cu", ".cuh", ".cmake", ".txt", ".md",
              ".sh", ".in", ".toml")
MARKER = re.compile(r"^\s*(?://+|#+|\*+|/\*+)?\s?")
SKIP = 77  # ctest's SKIP_RETURN_CODE for this test
DEFINITION = re.compile(r"Note \[([^\]]+)\](?:\s*$|:)")
REFERENCE = re.compile(r"Note \[([^\]]+)\]")


def names(text):
    return " ".join(text.split())


def scan(root):
    listed = subprocess.run(["git", "ls-files"], capture_output=True, text=True,
                            cwd=root).stdout.split("\n")
    defined, references = set(), []
    for path in listed:
        if not path.endswith(EXTENSIONS):
            continue
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                lines = f.read().split("\n")
        except (OSError, UnicodeDecodeError):
            continue
        stripped = [MARKER.sub("", line, count=1) for line in lines]
        for line in stripped:
            m = DEFINITION.match(line)
            if m:
                defined.add(names(m.group(1)))
        joined = re.sub(r'"\s*"', "", " ".join(stripped))
        references += [(path, names(m.group(1))) for m in REFERENCE.finditer(joined)
                       if m.group(1) != "..." and not m.group(1).startswith("<")]
    return defined, references


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if not os.path.isdir(os.path.join(root, ".git")):
        print(f"{root} is not a git checkout: nothing to list")
        return SKIP
    defined, references = scan(root)
    dangling = sorted({(p, r) for p, r in references if r not in defined})
    for path, name in dangling:
        print(f"{path}: Note {'[' + name + ']'} resolves to no Note")
    print(f"{len(defined)} Notes, {len(references)} references, {len(dangling)} dangling")
    return 1 if dangling else 0


if __name__ == "__main__":
    sys.exit(main())
