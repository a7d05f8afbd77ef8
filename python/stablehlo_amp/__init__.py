"""stablehlo-amp: automatic mixed precision as a compiler pass over StableHLO.

>>> import stablehlo_amp as amp
>>> str(amp.Policy.parse("p=f32,c=bf16"))
'p=f32,c=bf16,o=bf16'
"""

from stablehlo_amp._src.loss_scale import (DynamicLossScale, NoOpLossScale,
                                           StaticLossScale, all_finite,
                                           select_tree)
from stablehlo_amp._src.pipeline import (AmpError, InvalidIRError,
                                         RewriteError, RewriteOptions,
                                         RewriteResult, VerificationError,
                                         rewrite, rewrite_module)
from stablehlo_amp._src.policy import Policy
from stablehlo_amp._src.report import OpDecision, Report
from stablehlo_amp._src.program import Timings
from stablehlo_amp._src.training import (PrecisionHandler, TrainState,
                                         TrainStep, ValueAndGrad, train_step,
                                         value_and_grad)
from stablehlo_amp._src.transform import Lowered, Transformed, transform

__all__ = [
    "AmpError",
    "DynamicLossScale",
    "NoOpLossScale",
    "PrecisionHandler",
    "StaticLossScale",
    "TrainState",
    "TrainStep",
    "ValueAndGrad",
    "all_finite",
    "select_tree",
    "train_step",
    "value_and_grad",
    "InvalidIRError",
    "Lowered",
    "OpDecision",
    "Policy",
    "Report",
    "RewriteError",
    "RewriteOptions",
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
  from stablehlo_amp._src.plugin import plugin_path as _plugin_path
  return _plugin_path()
