"""stablehlo-amp: automatic mixed precision as a compiler pass over StableHLO.

>>> import stablehlo_amp as amp
>>> str(amp.Policy.parse("p=f32,c=bf16"))
'p=f32,c=bf16,o=bf16'
"""

from stablehlo_amp._src.loss_scale import (DynamicLossScale, NoOpLossScale,
                                           StaticLossScale, all_finite,
                                           select_tree)
from stablehlo_amp._src.pipeline import (AmpError, InvalidIRError,
                                         OptionError, RewriteError,
                                         RewriteOptions,
                                         RewriteResult, VerificationError,
                                         rewrite, rewrite_module)
from stablehlo_amp._src.numerics import (Fp8Fallback, Fp8FallbackEvent,
                                         GemmStats, NonFinite, explain)
from stablehlo_amp._src.policy import Policy
from stablehlo_amp._src.report import OpDecision, Report
from stablehlo_amp._src.program import Lowered, Timings
from stablehlo_amp._src.training import (PrecisionHandler, TrainState,
                                         TrainStep, ValueAndGrad, train_step,
                                         value_and_grad)
from stablehlo_amp._src.transform import Transformed, transform

__all__ = [
    "AmpError",
    "DynamicLossScale",
    "Fp8Fallback",
    "Fp8FallbackEvent",
    "GemmStats",
    "NoOpLossScale",
    "NonFinite",
    "PrecisionHandler",
    "StaticLossScale",
    "TrainState",
    "TrainStep",
    "ValueAndGrad",
    "all_finite",
    "explain",
    "select_tree",
    "train_step",
    "value_and_grad",
    "InvalidIRError",
    "Lowered",
    "OpDecision",
    "OptionError",
    "Policy",
    "Report",
    "RewriteError",
    "RewriteOptions",
    "RewriteResult",
    "Timings",
    "Transformed",
    "VerificationError",
    "rewrite",
    "plugin_mlir_opt",
    "plugin_path",
    "rewrite_module",
    "transform",
]


def plugin_path() -> str:
  """Path of the pass plugin for `mlir-opt --load-pass-plugin=...`."""
  from stablehlo_amp._src.plugin import plugin_path as _plugin_path
  return _plugin_path()


def plugin_mlir_opt() -> str:
  """The `mlir-opt` the plugin loads into: the one of the LLVM 22 it was
  built against (another LLVM 22 build fails with "Failed to load
  passes"). Raises PluginUnavailableError when it is not on this machine,
  saying which LLVM 22 to install."""
  from stablehlo_amp._src import plugin
  path = plugin.mlir_opt_path()
  if path is None:
    plugin_file = plugin.plugin_path(check=False)
    raise plugin.PluginUnavailableError(
        "the mlir-opt the plugin was built against is not on this machine. "
        + plugin.install_hint(plugin.needed_libraries(plugin_file)))
  return path
