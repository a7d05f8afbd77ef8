"""The precision policy: `p=f32,c=bf16,o=f32`, parsed by the C++ grammar."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stablehlo_amp import _amp
from stablehlo_amp._src import contract


@functools.cache
def _dtypes() -> dict[str, np.dtype]:
  """Canonical policy names to dtypes, from the contract's spellings."""
  table = {}
  for entry in contract.document()["policy"]["dtypes"]:
    # NumPy reads "f16" as a 16-byte float: try the long spellings first.
    spellings = sorted(entry["spellings"], key=lambda s: "float" not in s)
    for spelling in spellings:
      try:
        table[entry["name"]] = jnp.dtype(spelling)
        break
      except TypeError:
        continue
  return table


def dtype_name(dtype: Any) -> str:
  """The policy name of `dtype` ("bf16"); ValueError if it has none."""
  try:
    wanted = np.dtype(dtype)
  except TypeError:
    wanted = None
  for name, candidate in _dtypes().items():
    if candidate == wanted:
      return name
  raise ValueError(f"dtype {dtype!r} has no policy name (accepted: "
                   f"{', '.join(_dtypes())})")


def dtype_of(name: str) -> np.dtype:
  return _dtypes()[name]


def _is_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast_floats(tree: Any, dtype: Any) -> Any:
  return jax.tree_util.tree_map(
      lambda x: x.astype(dtype) if _is_float(x) else x, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
  """Which dtype parameters, computation, outputs and GEMM operands use.

  The grammar is jmp's: ``p=`` parameters, ``c=`` compute, ``o=`` output;
  compute follows params and output follows compute when omitted. The
  optional ``gemm=`` key gives matrix-multiply operands their own format
  (``gemm=f8``: scaled FP8, e4m3fn forward and e5m2 for gradients).

  >>> import stablehlo_amp as amp
  >>> policy = amp.Policy.parse("p=f32,c=bf16,o=f32")
  >>> str(policy)
  'p=f32,c=bf16,o=f32'
  >>> amp.Policy.parse("params=float32,compute=half")
  Policy(param_dtype=dtype('float32'), compute_dtype=dtype('float16'), output_dtype=dtype('float16'), gemm='compute')
  """

  param_dtype: np.dtype
  compute_dtype: np.dtype
  output_dtype: np.dtype
  gemm: str = "compute"

  def __post_init__(self):
    for field in ("param_dtype", "compute_dtype", "output_dtype"):
      value = np.dtype(getattr(self, field))
      dtype_name(value)  # validates
      object.__setattr__(self, field, value)
    # The C++ grammar validates the whole policy (FP8 only for gemm, ...).
    _amp.parse_policy(self._text())

  @classmethod
  def parse(cls, text: "str | Policy") -> "Policy":
    """Parses ``p=...,c=...,o=...[,gemm=...]``; ValueError lists the
    accepted forms."""
    if isinstance(text, Policy):
      return text
    if not isinstance(text, str):
      raise TypeError(f"policy must be a string like 'p=f32,c=bf16,o=f32', "
                      f"got {type(text).__name__}")
    fields = _amp.parse_policy(text)
    return cls(dtype_of(fields["param"]), dtype_of(fields["compute"]),
               dtype_of(fields["output"]), fields["gemm"])

  def _text(self) -> str:
    text = (f"p={dtype_name(self.param_dtype)},"
            f"c={dtype_name(self.compute_dtype)},"
            f"o={dtype_name(self.output_dtype)}")
    return f"{text},gemm={self.gemm}"

  def __str__(self) -> str:
    return _amp.parse_policy(self._text())["text"]

  def cast_to_param(self, tree: Any) -> Any:
    """Casts the float leaves of `tree` to the param dtype."""
    return _cast_floats(tree, self.param_dtype)

  def cast_to_compute(self, tree: Any) -> Any:
    """Casts the float leaves of `tree` to the compute dtype."""
    return _cast_floats(tree, self.compute_dtype)

  def cast_to_output(self, tree: Any) -> Any:
    """Casts the float leaves of `tree` to the output dtype."""
    return _cast_floats(tree, self.output_dtype)


def as_policy(policy: "Policy | str") -> Policy:
  return policy if isinstance(policy, Policy) else Policy.parse(policy)
