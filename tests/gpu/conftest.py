"""Shared fixtures of the GPU tests: every test draws fresh random inputs (a new seed each run, so repeated runs
cover new values); files that need fixed inputs (graph capture, bounds, host path) override `_seed` with seed 0."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    yield
