"""The precision policy: `p=f32,c=bf16,o=f32`, parsed by the C++ grammar."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stablehlo_amp import _amp

# Canonical names (what the C++ parser prints) to dtypes.
_DTYPES: dict[str, Any] = {
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
    "f16": jnp.float16,
    "f64": jnp.float64,
    "f8e4m3fn": jnp.float8_e4m3fn,
    "f8e5m2": jnp.float8_e5m2,
}
_NAMES = {np.dtype(dtype): name for name, dtype in _DTYPES.items()}

LEVELS = ("O0", "O1", "O2", "O3")


def dtype_name(dtype: Any) -> str:
  """The policy name of `dtype` ("bf16"); ValueError if it has none."""
  try:
    return _NAMES[np.dtype(dtype)]
  except (KeyError, TypeError):
    raise ValueError(
        f"dtype {dtype!r} has no policy name (accepted: {', '.join(_DTYPES)})"
    ) from None


def _is_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast_floats(tree: Any, dtype: Any) -> Any:
  return jax.tree_util.tree_map(
      lambda x: x.astype(dtype) if _is_float(x) else x, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
  """Which dtype parameters, computation and outputs use.

  The grammar is jmp's: ``p=`` parameters, ``c=`` compute, ``o=`` output;
  compute follows params and output follows compute when omitted.

  >>> import stablehlo_amp as amp
  >>> policy = amp.Policy.parse("p=f32,c=bf16,o=f32")
  >>> str(policy)
  'p=f32,c=bf16,o=f32'
  >>> amp.Policy.parse("params=float32,compute=half")
  Policy(param_dtype=dtype('float32'), compute_dtype=dtype('float16'), output_dtype=dtype('float16'))
  """

  param_dtype: np.dtype
  compute_dtype: np.dtype
  output_dtype: np.dtype

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = np.dtype(getattr(self, field.name))
      dtype_name(value)  # validates
      object.__setattr__(self, field.name, value)

  @classmethod
  def parse(cls, text: str) -> "Policy":
    """Parses ``p=...,c=...,o=...``; ValueError lists the accepted forms."""
    if isinstance(text, Policy):
      return text
    if not isinstance(text, str):
      raise TypeError(f"policy must be a string like 'p=f32,c=bf16,o=f32', "
                      f"got {type(text).__name__}")
    canonical = _amp.canonical_policy(text)
    fields = dict(item.split("=") for item in canonical.split(","))
    return cls(_DTYPES[fields["p"]], _DTYPES[fields["c"]], _DTYPES[fields["o"]])

  def __str__(self) -> str:
    return (f"p={dtype_name(self.param_dtype)},"
            f"c={dtype_name(self.compute_dtype)},"
            f"o={dtype_name(self.output_dtype)}")

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


def check_level(level: str) -> str:
  return _amp.canonical_level(level)


def policy_grammar() -> str:
  return _amp.policy_grammar()
