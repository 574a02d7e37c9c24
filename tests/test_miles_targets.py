"""The dotted paths Miles is given (``rescue.miles.targets``) name rescue's classes."""

from __future__ import annotations

import importlib

import pytest

from rescue.miles import pace
from rescue.miles.buffer import RescueDataBuffer
from rescue.miles.targets import BUFFER_PATH, PACE_ROLLOUT_FUNCTION


def test_the_buffer_path_names_the_buffer():
    module, _, name = BUFFER_PATH.rpartition(".")
    assert getattr(importlib.import_module(module), name) is RescueDataBuffer
    assert f"{RescueDataBuffer.__module__}.{RescueDataBuffer.__qualname__}" == BUFFER_PATH


def test_the_pace_rollout_function_path_names_the_rollout_function():
    module, _, name = PACE_ROLLOUT_FUNCTION.rpartition(".")
    assert importlib.import_module(module) is pace
    with pytest.raises(AttributeError):  # the module builds exactly this name, nothing else
        pace.__getattr__(name + "X")
    from miles_env import require_miles

    require_miles()
    cls = getattr(pace, name)
    assert f"{cls.__module__}.{cls.__qualname__}" == PACE_ROLLOUT_FUNCTION
