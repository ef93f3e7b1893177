"""The gpu suite's Python part: test_cuda.py under pytest where torch sees a
CUDA device; exit 77 (meson: skipped) elsewhere."""

import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    print("no CUDA device here: the gpu suite is skipped")
    sys.exit(77)
here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", os.path.join(here, "test_cuda.py")]))
