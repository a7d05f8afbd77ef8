"""Runs a check script on 8 CPU devices and reads the JSON it prints.

The device count comes from XLA_FLAGS, which JAX reads once when it
initialises its backend, so multi-device checks run in a subprocess; the
assertions stay in the tests.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest


def run_json(script: pathlib.Path, *args: str, xla_flags: str = "",
             timeout: int = 900) -> dict:
  """`python script *args` with 8 CPU devices (and `xla_flags`); its
  standard output as JSON. A failing script fails the test with its
  error output."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} "
                      f"--xla_force_host_platform_device_count=8 "
                      f"{xla_flags}").strip()
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run([sys.executable, str(script), *args], env=env,
                          capture_output=True, text=True, timeout=timeout,
                          check=False)
  if result.returncode != 0:
    pytest.fail(f"{script.name} {' '.join(args)} failed (exit "
                f"{result.returncode}):\n{result.stderr[-4000:]}")
  return json.loads(result.stdout)
