// amp-round-state alone: a step's new bf16 state (a result marked
// amp.state_of whose value is converted from f32 right before the return)
// is rounded stochastically with bits from an appended ui32[4] state: per
// tensor, rng_bit_generator draws a ui32[2] key, and each element's 16
// random bits are a hash (two rounds of lowbias32) of its index under it.
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{rounding=stochastic})' | FileCheck %s
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state)' | FileCheck %s --check-prefix=NEAREST
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{rounding=up})' 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: invalid option 'rounding': unknown update rounding 'up' (accepted: nearest, stochastic, kahan)
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{rounding=kahan})' | FileCheck %s --check-prefix=KAHAN
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=bf16 rounding=kahan})' | FileCheck %s --check-prefix=OPT-KAHAN
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=bf16})' | FileCheck %s --check-prefix=OPT
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=bf16 rounding=stochastic})' | FileCheck %s --check-prefix=OPT-SR
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=f16})' 2>&1 | FileCheck %s --check-prefix=BAD-OPT
// BAD-OPT: error: invalid option 'optimizer-state': unknown optimizer-state dtype 'f16' (accepted: f32, bf16, f8)

// Two bf16 states share one chain of random bits; the f32 state is left
// alone; the key's next value is a state of the key argument, so
// amp-loss-scale keeps the old one on a skipped step.
// CHECK-LABEL: func.func public @main(
// CHECK-SAME: %[[KEY:arg[0-9]+]]: tensor<4xui32> {amp.rounding_key})
// CHECK-SAME: -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xf32> {amp.state_of = 2 : i64}, tensor<2x3xbf16> {amp.state_of = 3 : i64}, tensor<4xui32> {amp.rounding_key, amp.state_of = 4 : i64})
// CHECK: %[[PAIRS:.*]] = stablehlo.reshape %[[KEY]] : (tensor<4xui32>) -> tensor<2x2xui32>
// CHECK: %[[S0:.*]] = stablehlo.bitcast_convert %[[PAIRS]] : (tensor<2x2xui32>) -> tensor<2xui64>
// CHECK: %[[NEW:.*]] = stablehlo.add
// CHECK: %[[S1:.*]], %[[TKEY:.*]] = stablehlo.rng_bit_generator %[[S0]], algorithm = THREE_FRY : (tensor<2xui64>) -> (tensor<2xui64>, tensor<2xui32>)
// CHECK: %[[INDEX:.*]] = stablehlo.iota dim = 0 : tensor<4xui32>
// CHECK: stablehlo.slice %[[TKEY]] [0:1]
// CHECK: stablehlo.xor %[[INDEX]], %{{.*}} : tensor<4xui32>
// CHECK-COUNT-2: stablehlo.constant dense<2221713035> : tensor<ui32>
// CHECK: stablehlo.shift_right_logical
// CHECK: stablehlo.xor
// CHECK: %[[NOISE:.*]] = stablehlo.shift_right_logical %{{.*}} : tensor<4xui32>
// CHECK-NEXT: %[[WORDS:.*]] = stablehlo.bitcast_convert %[[NEW]] : (tensor<4xf32>) -> tensor<4xui32>
// CHECK-NEXT: %[[SUM:.*]] = stablehlo.add %[[WORDS]], %[[NOISE]] : tensor<4xui32>
// CHECK: %[[HIGH16:.*]] = stablehlo.constant dense<4294901760> : tensor<ui32>
// CHECK: %[[HIGHB:.*]] = stablehlo.broadcast_in_dim %[[HIGH16]]
// CHECK: %[[CUT:.*]] = stablehlo.and %[[SUM]], %[[HIGHB]] : tensor<4xui32>
// CHECK: %[[Y:.*]] = stablehlo.bitcast_convert %[[CUT]] : (tensor<4xui32>) -> tensor<4xf32>
// CHECK: %[[FINITE:.*]] = stablehlo.is_finite %[[NEW]]
// CHECK: %[[Z:.*]] = stablehlo.select %[[FINITE]], %[[Y]], %[[NEW]]
// CHECK: %[[W:.*]] = stablehlo.convert %[[Z]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NOT: stablehlo.convert %[[NEW]]
// CHECK: %[[S2:.*]], %{{.*}} = stablehlo.rng_bit_generator %[[S1]], algorithm = THREE_FRY : (tensor<2xui64>) -> (tensor<2xui64>, tensor<2xui32>)
// CHECK: %[[INDEX2:.*]] = stablehlo.iota dim = 0 : tensor<6xui32>
// CHECK-NEXT: stablehlo.reshape %[[INDEX2]] : (tensor<6xui32>) -> tensor<2x3xui32>
// CHECK: %[[V:.*]] = stablehlo.convert %{{.*}} : (tensor<2x3xf32>) -> tensor<2x3xbf16>
// CHECK: %[[NEXTP:.*]] = stablehlo.bitcast_convert %[[S2]] : (tensor<2xui64>) -> tensor<2x2xui32>
// CHECK: %[[NEXT:.*]] = stablehlo.reshape %[[NEXTP]] : (tensor<2x2xui32>) -> tensor<4xui32>
// CHECK: return %[[W]], %{{.*}}, %[[V]], %[[NEXT]]

// rounding=kahan: one bf16 compensation buffer per rounded bf16 state, an
// argument and a result marked amp.compensation = the state's argument
// (the result also a state of the buffer's argument). The new value plus
// the buffer is rounded to nearest by reduce_precision (which XLA never
// folds) and what the rounding lost is the buffer's next value. No random
// bits; the f32 state is left alone.
// KAHAN-LABEL: func.func public @main(
// KAHAN-SAME: %[[W:arg0]]: tensor<4xbf16>
// KAHAN-SAME: %[[C0:arg4]]: tensor<4xbf16> {amp.compensation = 0 : i64}, %[[C3:arg5]]: tensor<2x3xbf16> {amp.compensation = 3 : i64})
// KAHAN-SAME: -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xf32> {amp.state_of = 2 : i64}, tensor<2x3xbf16> {amp.state_of = 3 : i64}, tensor<4xbf16> {amp.compensation = 0 : i64, amp.state_of = 4 : i64}, tensor<2x3xbf16> {amp.compensation = 3 : i64, amp.state_of = 5 : i64})
// KAHAN-NOT: rng_bit_generator
// KAHAN: %[[NEW:.*]] = stablehlo.add %{{.*}}, %arg1 : tensor<4xf32>
// KAHAN: %[[CW:.*]] = stablehlo.convert %[[C0]] : (tensor<4xbf16>) -> tensor<4xf32>
// KAHAN: %[[SUM:.*]] = stablehlo.add %[[NEW]], %[[CW]] : tensor<4xf32>
// KAHAN: %[[ROUNDED:.*]] = stablehlo.reduce_precision %[[SUM]], format = e8m7 : tensor<4xf32>
// KAHAN: %[[P:.*]] = stablehlo.convert %[[ROUNDED]] : (tensor<4xf32>) -> tensor<4xbf16>
// KAHAN: %[[LOST:.*]] = stablehlo.subtract %[[SUM]], %[[ROUNDED]] : tensor<4xf32>
// KAHAN: %[[NEXTC:.*]] = stablehlo.convert %[[LOST]] : (tensor<4xf32>) -> tensor<4xbf16>
// KAHAN-NOT: stablehlo.convert %[[NEW]]
// KAHAN: %[[CV:.*]] = stablehlo.convert %[[C3]] : (tensor<2x3xbf16>) -> tensor<2x3xf32>
// KAHAN: %[[SUM3:.*]] = stablehlo.add %{{.*}}, %[[CV]] : tensor<2x3xf32>
// KAHAN: %[[ROUNDED3:.*]] = stablehlo.reduce_precision %[[SUM3]], format = e8m7
// KAHAN: %[[P3:.*]] = stablehlo.convert %[[ROUNDED3]] : (tensor<2x3xf32>) -> tensor<2x3xbf16>
// KAHAN: %[[LOST3:.*]] = stablehlo.subtract %[[SUM3]], %[[ROUNDED3]]
// KAHAN: %[[NEXTC3:.*]] = stablehlo.convert %[[LOST3]] : (tensor<2x3xf32>) -> tensor<2x3xbf16>
// KAHAN: return %[[P]], %{{.*}}, %[[P3]], %[[NEXTC]], %[[NEXTC3]]

// NEAREST-LABEL: func.func public @main(
// NEAREST-NOT: rounding_key
// NEAREST-NOT: rng_bit_generator
// NEAREST: stablehlo.convert %{{.*}} : (tensor<4xf32>) -> tensor<4xbf16>
func.func public @main(%w: tensor<4xbf16>, %u: tensor<4xf32>, %m: tensor<4xf32>, %v: tensor<2x3xbf16>) -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xf32> {amp.state_of = 2 : i64}, tensor<2x3xbf16> {amp.state_of = 3 : i64}) {
  %0 = stablehlo.convert %w : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.add %0, %u : tensor<4xf32>
  %2 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xbf16>
  %3 = stablehlo.multiply %m, %u : tensor<4xf32>
  %4 = stablehlo.convert %v : (tensor<2x3xbf16>) -> tensor<2x3xf32>
  %5 = stablehlo.exponential %4 : tensor<2x3xf32>
  %6 = stablehlo.convert %5 : (tensor<2x3xf32>) -> tensor<2x3xbf16>
  return %2, %3, %6 : tensor<4xbf16>, tensor<4xf32>, tensor<2x3xbf16>
}

// -----

// f16 state, a bf16 result that is no state, and a state passed through
// unchanged are not rounded: nothing is appended.
// CHECK-LABEL: func.func public @untouched(
// KAHAN-LABEL: func.func public @untouched(
// KAHAN-NOT: amp.compensation
// KAHAN-NOT: reduce_precision
// KAHAN: return
// CHECK-NOT: rounding_key
// CHECK-NOT: rng_bit_generator
// CHECK: return
func.func public @untouched(%h: tensor<4xf16>, %b: tensor<4xbf16>, %u: tensor<4xf32>) -> (tensor<4xf16> {amp.state_of = 0 : i64}, tensor<4xbf16>, tensor<4xbf16> {amp.state_of = 1 : i64}) {
  %0 = stablehlo.convert %h : (tensor<4xf16>) -> tensor<4xf32>
  %1 = stablehlo.add %0, %u : tensor<4xf32>
  %2 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xf16>
  %3 = stablehlo.convert %1 : (tensor<4xf32>) -> tensor<4xbf16>
  return %2, %3, %b : tensor<4xf16>, tensor<4xbf16>, tensor<4xbf16>
}

// -----

// optimizer-state=bf16: the marked f32 moment becomes a bf16 argument read
// back in f32, its new value is rounded to bf16 to nearest (with
// rounding=stochastic only the bf16 parameter draws bits); a marked state returned
// unchanged is returned as the bf16 argument; the unmarked f32 state and
// the counter keep their dtypes. The marker is consumed. The parameter's
// update reads the stored moment, widened through its bits (a convert pair
// XLA would fold back into the f32 value), not the f32 new value.
// OPT: func.func public @main(%[[W:arg0]]: tensor<4xbf16>, %[[M:arg1]]: tensor<4xbf16>, %[[G:arg2]]: tensor<4xf32>, %[[C:arg3]]: tensor<i32>, %[[K:arg4]]: tensor<4xf32>, %[[H:arg5]]: tensor<4xbf16>)
// OPT-SAME: -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xbf16> {amp.state_of = 1 : i64}, tensor<i32> {amp.state_of = 3 : i64}, tensor<4xf32> {amp.state_of = 4 : i64}, tensor<4xbf16> {amp.state_of = 5 : i64})
// OPT-NOT: amp.optimizer_state
// OPT: %[[MW:.*]] = stablehlo.convert %[[M]] : (tensor<4xbf16>) -> tensor<4xf32>
// OPT: %[[NEWM:.*]] = stablehlo.add %{{.*}}, %[[G]] : tensor<4xf32>
// OPT-NEXT: %[[LOWM:.*]] = stablehlo.convert %[[NEWM]] : (tensor<4xf32>) -> tensor<4xbf16>
// OPT-NEXT: %[[HALVES:.*]] = stablehlo.bitcast_convert %[[LOWM]] : (tensor<4xbf16>) -> tensor<4xui16>
// OPT-NEXT: %[[WIDE:.*]] = stablehlo.convert %[[HALVES]] : (tensor<4xui16>) -> tensor<4xui32>
// OPT-NEXT: %[[SIXTEEN:.*]] = stablehlo.constant dense<16> : tensor<ui32>
// OPT-NEXT: %[[SIXTEENS:.*]] = stablehlo.broadcast_in_dim %[[SIXTEEN]]
// OPT-NEXT: %[[HIGH:.*]] = stablehlo.shift_left %[[WIDE]], %[[SIXTEENS]] : tensor<4xui32>
// OPT-NEXT: %[[STORED:.*]] = stablehlo.bitcast_convert %[[HIGH]] : (tensor<4xui32>) -> tensor<4xf32>
// OPT-NOT: %[[NEWM]]
// OPT: stablehlo.subtract %{{.*}}, %[[STORED]] : tensor<4xf32>
// OPT-NOT: %[[NEWM]]
// OPT: return %{{.*}}, %[[LOWM]], %[[C]], %{{.*}}, %[[H]] :

// OPT-SR: func.func public @main(%arg0: tensor<4xbf16>, %arg1: tensor<4xbf16>,
// OPT-SR: %[[LOWM:.*]] = stablehlo.convert %{{.*}} : (tensor<4xf32>) -> tensor<4xbf16>
// OPT-SR-COUNT-1: stablehlo.rng_bit_generator
// OPT-SR-NOT: stablehlo.rng_bit_generator
// OPT-SR: %[[LOWW:.*]] = stablehlo.convert %{{.*}} : (tensor<4xf32>) -> tensor<4xbf16>
// OPT-SR: return %[[LOWW]], %[[LOWM]],

// OPT-KAHAN: func.func public @main(%arg0: tensor<4xbf16>, %arg1: tensor<4xbf16>, %arg2: tensor<4xf32>, %arg3: tensor<i32>, %arg4: tensor<4xf32>, %arg5: tensor<4xbf16>, %[[BUF:arg6]]: tensor<4xbf16> {amp.compensation = 0 : i64})
// OPT-KAHAN-SAME: tensor<4xbf16> {amp.compensation = 0 : i64, amp.state_of = 6 : i64})
// OPT-KAHAN: %[[NEWM:.*]] = stablehlo.add %{{.*}}, %arg2 : tensor<4xf32>
// OPT-KAHAN-NEXT: %[[LOWM:.*]] = stablehlo.convert %[[NEWM]] : (tensor<4xf32>) -> tensor<4xbf16>
// OPT-KAHAN: %{{.*}} = stablehlo.convert %[[BUF]]
// OPT-KAHAN-COUNT-1: stablehlo.reduce_precision
// OPT-KAHAN-NOT: stablehlo.reduce_precision
// OPT-KAHAN: return %{{.*}}, %[[LOWM]], %arg3, %{{.*}}, %arg5, %{{.*}} :
func.func public @main(%w: tensor<4xbf16>, %m: tensor<4xf32> {amp.optimizer_state}, %g: tensor<4xf32>, %c: tensor<i32>, %k: tensor<4xf32>, %h: tensor<4xf32> {amp.optimizer_state}) -> (tensor<4xbf16> {amp.state_of = 0 : i64}, tensor<4xf32> {amp.state_of = 1 : i64}, tensor<i32> {amp.state_of = 3 : i64}, tensor<4xf32> {amp.state_of = 4 : i64}, tensor<4xf32> {amp.state_of = 5 : i64}) {
  %0 = stablehlo.multiply %m, %g : tensor<4xf32>
  %1 = stablehlo.add %0, %g : tensor<4xf32>
  %2 = stablehlo.convert %w : (tensor<4xbf16>) -> tensor<4xf32>
  %3 = stablehlo.subtract %2, %1 : tensor<4xf32>
  %4 = stablehlo.convert %3 : (tensor<4xf32>) -> tensor<4xbf16>
  %5 = stablehlo.add %k, %h : tensor<4xf32>
  return %4, %1, %c, %5, %h : tensor<4xbf16>, tensor<4xf32>, tensor<i32>, tensor<4xf32>, tensor<4xf32>
}

