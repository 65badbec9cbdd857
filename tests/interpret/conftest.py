"""Runs only under TRITON_INTERPRET=1 (tests/test_triton_interpreter.py starts it)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.exit("tests/interpret must run with TRITON_INTERPRET=1", returncode=2)
