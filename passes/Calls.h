//===- Calls.h - Calls analysed in their callers' context -----------------===//
//
// JAX lowers library functions (`jnp.var`, `jnp.std`, `jax.nn.relu`, the
// `jnp.linalg` helpers) and nested `jit`s to private functions.
// Every rule of the precision analysis (storage, decisions and linear
// algebra, FP8 eligibility, calibration groups) reads producers and users
// within a function, so each call is specialised first: its callee's body is
// put in its place, one copy per call site, and a function called from two
// contexts is decided in each. XLA's CallInliner does the same to every call
// before it optimises, so the program XLA compiles is unchanged by it.
//
//===----------------------------------------------------------------------===//

#ifndef STABLEHLO_AMP_CALLS_H
#define STABLEHLO_AMP_CALLS_H

#include "mlir/IR/BuiltinOps.h"

namespace mlir::amp {

/// Replaces every `func.call` of a private, defined, single-block function
/// by a copy of its body, repeatedly (the copies' own calls too), and erases
/// the callees this leaves unused. Calls that carry attributes of their own
/// (Shardy's manual-computation bodies, frontend attributes), callees with
/// argument or result attributes (shardings, layouts), public callees,
/// recursive functions and functions without f32 values (nothing to decide:
/// an f64 program stays byte-identical) are kept as calls. Returns the number
/// of calls inlined.
int64_t inlinePrivateCalls(ModuleOp module);

} // namespace mlir::amp

#endif // STABLEHLO_AMP_CALLS_H
