// amp-round-state alone on a step exported without the amp.state_of and
// amp.optimizer_state marks: the state-results and optimizer-state-args
// options name them.
//
// RUN: amp-opt %s --pass-pipeline='builtin.module(amp-round-state{rounding=kahan optimizer-state=bf16 state-results=0:0,1:1 optimizer-state-args=1})' | FileCheck %s --check-prefix=NAMED
// RUN: not amp-opt %s --pass-pipeline='builtin.module(amp-round-state{state-results=5:0})' 2>&1 | FileCheck %s --check-prefix=NAMED-BAD-RANGE
// RUN: not amp-opt %s --pass-pipeline='builtin.module(amp-round-state{state-results=2:0})' 2>&1 | FileCheck %s --check-prefix=NAMED-BAD-TYPE
// RUN: not amp-opt %s --pass-pipeline='builtin.module(amp-round-state{optimizer-state-args=7})' 2>&1 | FileCheck %s --check-prefix=NAMED-BAD-ARG
// RUN: not amp-opt %s --pass-pipeline='builtin.module(amp-round-state{state-results=0-0})' 2>&1 | FileCheck %s --check-prefix=NAMED-BAD-PAIR

// A step exported without the marks (a plain jax.jit step): state-results
// and optimizer-state-args name them, and the pass marks them as a front end
// would (amp-loss-scale reads the amp.state_of marks next).
// NAMED-LABEL: func.func public @main(
// NAMED-SAME: %arg1: tensor<4xbf16>, %arg2: tensor<4xf32>, %[[BUF:arg3]]: tensor<4xbf16> {amp.compensation = 0 : i64})
// NAMED-SAME: -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xbf16> {amp.state_of = 1 : i64}, tensor<f32>, tensor<4xbf16> {amp.compensation = 0 : i64, amp.state_of = 3 : i64})
// NAMED: stablehlo.reduce_precision
// NAMED: return
// NAMED-BAD-RANGE: error: state result #5 of argument #0 does not exist
// NAMED-BAD-TYPE: error: state result #2 ('tensor<f32>') does not have the type of argument #0 ('tensor<4xbf16>')
// NAMED-BAD-ARG: error: invalid option 'optimizer-state-args': argument 7 of 3
// NAMED-BAD-PAIR: error: invalid option 'state-results': '0-0' is not RESULT:ARG
func.func public @main(%w: tensor<4xbf16>, %m: tensor<4xf32>, %g: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xf32>, tensor<f32>) {
  %0 = stablehlo.multiply %m, %g : tensor<4xf32>
  %1 = stablehlo.convert %w : (tensor<4xbf16>) -> tensor<4xf32>
  %2 = stablehlo.subtract %1, %0 : tensor<4xf32>
  %3 = stablehlo.convert %2 : (tensor<4xf32>) -> tensor<4xbf16>
  %c = stablehlo.constant dense<1.0> : tensor<f32>
  return %3, %0, %c : tensor<4xbf16>, tensor<4xf32>, tensor<f32>
}
