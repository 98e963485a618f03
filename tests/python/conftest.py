# torch first, as a user's program does; stash's libraries load into a linker namespace of
# their own on the CPU test double (STASH_CUDART, Note [A linker namespace for stash's
# libcudart] in stash/_lib.py), so the order does not matter to them.
import torch  # noqa: F401
