# torch first: stash's libraries and torch must load the same libcudart.so.13 (on CPU
# machines, the test double that LD_LIBRARY_PATH names).
import torch  # noqa: F401
