"""stablehlo-amp: automatic mixed precision as a compiler pass over StableHLO.

>>> import stablehlo_amp as amp
>>> str(amp.Policy.parse("p=f32,c=bf16"))
'p=f32,c=bf16,o=bf16'
"""

from stablehlo_amp._src.pipeline import (AmpError, InvalidIRError,
                                         RewriteError, RewriteResult,
                                         VerificationError, rewrite,
                                         rewrite_module)
from stablehlo_amp._src.policy import Policy
from stablehlo_amp._src.report import OpDecision, Report
from stablehlo_amp._src.transform import Lowered, Timings, Transformed, transform

__all__ = [
    "AmpError",
    "InvalidIRError",
    "Lowered",
    "OpDecision",
    "Policy",
    "Report",
    "RewriteError",
    "RewriteResult",
    "Timings",
    "Transformed",
    "VerificationError",
    "rewrite",
    "plugin_path",
    "rewrite_module",
    "transform",
]


def plugin_path() -> str:
  """Path of the pass plugin for `mlir-opt --load-pass-plugin=...`."""
  import importlib.resources
  return str(importlib.resources.files(__name__) / "AmpPassPlugin.so")
