// amp-loss-scale through amp-opt. The inputs are split with split-file: the
// positive cases (ok.mlir, chunks separated by `// -----`) and the inputs the
// pass must reject each need their own amp-opt run, because amp-opt exits 1
// when any chunk of a file fails. Each option variant has its own RUN line
// and prefix.
//
// RUN: rm -rf %t && split-file --leading-lines %s %t
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale)' | FileCheck %s
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale{mode=dynamic})' | FileCheck %s
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale{mode=static})' | FileCheck %s --check-prefix=STATIC
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale{mode=none check-grads=true})' | FileCheck %s --check-prefix=NONE
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale{mode=none})' | FileCheck %s --check-prefix=UNCHECKED
// RUN: amp-opt %t/ok.mlir --split-input-file --pass-pipeline='builtin.module(amp-loss-scale{growth-interval=100 growth-factor=4.0 backoff-factor=0.25 min-scale=0.03125 max-scale=65536.0})' | FileCheck %s --check-prefix=OPT
// RUN: amp-opt %t/indices.mlir --pass-pipeline='builtin.module(amp-loss-scale{seed-arg=2 gradient-results=0,1 state-results=2:0})' | FileCheck %s --check-prefix=IDX
//
// RUN: amp-opt %t/check_state.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=dynamic check-state=true})' | FileCheck %s --check-prefix=STATECHECK
// RUN: amp-opt %t/check_state.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=none check-grads=true})' | FileCheck %s --check-prefix=NONE-STATE
// RUN: amp-opt %t/check_state.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=none})' | FileCheck %s --check-prefix=UNCHECKED-STATE
// RUN: amp-opt %t/check_state.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=none check-state=true})' | FileCheck %s --check-prefix=NONE-SKIP
// RUN: not amp-opt %t/no_seed.mlir --pass-pipeline='builtin.module(amp-loss-scale)' 2>&1 | FileCheck %s --check-prefix=ERR-SEED
// RUN: not amp-opt %t/no_gradients.mlir --pass-pipeline='builtin.module(amp-loss-scale)' 2>&1 | FileCheck %s --check-prefix=ERR-GRAD
// RUN: not amp-opt %t/no_gradients.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=none})' 2>&1 | FileCheck %s --check-prefix=ERR-GRAD
// RUN: not amp-opt %t/state_mismatch.mlir --pass-pipeline='builtin.module(amp-loss-scale)' 2>&1 | FileCheck %s --check-prefix=ERR-STATE
// RUN: not amp-opt %t/valid.mlir --pass-pipeline='builtin.module(amp-loss-scale{mode=bogus})' 2>&1 | FileCheck %s --check-prefix=ERR-MODE
// RUN: not amp-opt %t/valid.mlir --pass-pipeline='builtin.module(amp-loss-scale{backoff-factor=2})' 2>&1 | FileCheck %s --check-prefix=ERR-BACKOFF
// RUN: not amp-opt %t/valid.mlir --pass-pipeline='builtin.module(amp-loss-scale{growth-interval=0})' 2>&1 | FileCheck %s --check-prefix=ERR-INTERVAL
// RUN: not amp-opt %t/valid.mlir --pass-pipeline='builtin.module(amp-loss-scale{min-scale=0})' 2>&1 | FileCheck %s --check-prefix=ERR-MIN

//--- ok.mlir

// The seed becomes seed * scale (a new f32 argument), before any other use;
// the markers are consumed and the dynamic state is appended, typed, to the
// signature.

// CHECK-LABEL: module @seed_scaled
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[SEED:[^:]*]]: tensor<f32>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}, %[[COUNTER:[^:]*]]: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// CHECK-NEXT: %[[SCALED:.*]] = stablehlo.multiply %[[SEED]], %[[SCALE]] : tensor<f32>
// CHECK-NOT: %[[SEED]]
// CHECK: %[[B:.*]] = stablehlo.broadcast_in_dim %[[SCALED]], dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK: %[[G:.*]] = stablehlo.multiply %[[W]], %[[B]] : tensor<8xf32>
// CHECK: return %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>

// mode=static: one extra argument (the scale), one extra result (the
// predicate), no counter and no update.
// STATIC-LABEL: module @seed_scaled
// STATIC: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[SEED:[^:]*]]: tensor<f32>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}) -> (tensor<8xf32>, tensor<i1> {amp.grads_finite})
// STATIC-NEXT: %[[SCALED:.*]] = stablehlo.multiply %[[SEED]], %[[SCALE]] : tensor<f32>
// STATIC-NEXT: %[[ONE:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<f32>
// STATIC-NEXT: %[[INV:.*]] = stablehlo.divide %[[ONE]], %[[SCALE]] : tensor<f32>
// STATIC-NOT: stablehlo.select
// STATIC-NOT: stablehlo.compare
// STATIC: return %[[U:[^,]*]], %[[FINITE:[^ ]*]] : tensor<8xf32>, tensor<i1>

// mode=none check-grads=true: no new argument, nothing scaled or unscaled;
// the check and the predicate remain.
// NONE-LABEL: module @seed_scaled
// NONE: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[SEED:[^:]*]]: tensor<f32>) -> (tensor<8xf32>, tensor<i1> {amp.grads_finite})
// NONE-NEXT: %[[B:.*]] = stablehlo.broadcast_in_dim %[[SEED]], dims = [] : (tensor<f32>) -> tensor<8xf32>
// NONE-NEXT: %[[G:.*]] = stablehlo.multiply %[[W]], %[[B]] : tensor<8xf32>
// NONE-NEXT: %[[F:.*]] = stablehlo.is_finite %[[G]] : (tensor<8xf32>) -> tensor<8xi1>
// NONE-NOT: stablehlo.divide
// NONE-NOT: stablehlo.multiply
// NONE: return %[[G]], %{{.*}} : tensor<8xf32>, tensor<i1>
// mode=none alone checks nothing: the gradient is returned as made, and
// nothing is appended.
// UNCHECKED-LABEL: module @seed_scaled
// UNCHECKED: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[SEED:[^:]*]]: tensor<f32>) -> tensor<8xf32> {
// UNCHECKED-NEXT: %[[B:.*]] = stablehlo.broadcast_in_dim %[[SEED]], dims = [] : (tensor<f32>) -> tensor<8xf32>
// UNCHECKED-NEXT: %[[G:.*]] = stablehlo.multiply %[[W]], %[[B]] : tensor<8xf32>
// UNCHECKED-NEXT: return %[[G]] : tensor<8xf32>
module @seed_scaled {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    return %g : tensor<8xf32>
  }
}

// -----

// Two gradient results: 1 / scale is computed once, in f32, and each
// gradient is multiplied by it (broadcast to its shape).

// CHECK-LABEL: module @reciprocal_once
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[V:[^:]*]]: tensor<4x8xf32>, %[[SEED:[^:]*]]: tensor<f32>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}, %{{[^:]*}}: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<4x8xf32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// CHECK-NOT: stablehlo.divide
// CHECK: %[[ONE:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[INV:.*]] = stablehlo.divide %[[ONE]], %[[SCALE]] : tensor<f32>
// CHECK-NOT: stablehlo.divide
// CHECK: %[[G0:.*]] = stablehlo.multiply %[[W]], %{{.*}} : tensor<8xf32>
// CHECK-NOT: stablehlo.divide
// CHECK: %[[G1:.*]] = stablehlo.multiply %[[V]], %{{.*}} : tensor<4x8xf32>
// CHECK-NOT: stablehlo.divide
// CHECK: %[[IB0:.*]] = stablehlo.broadcast_in_dim %[[INV]], dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK-NEXT: %[[U0:.*]] = stablehlo.multiply %[[G0]], %[[IB0]] : tensor<8xf32>
// CHECK-NOT: stablehlo.divide
// CHECK: %[[IB1:.*]] = stablehlo.broadcast_in_dim %[[INV]], dims = [] : (tensor<f32>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[U1:.*]] = stablehlo.multiply %[[G1]], %[[IB1]] : tensor<4x8xf32>
// CHECK-NOT: stablehlo.divide
// CHECK: return %[[U0]], %[[U1]], %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<4x8xf32>, tensor<i1>, tensor<f32>, tensor<i32>

// With mode=static the reciprocal is also computed once.
// STATIC-LABEL: module @reciprocal_once
// STATIC-COUNT-1: stablehlo.divide
// STATIC-NOT: stablehlo.divide
// STATIC: return
module @reciprocal_once {
  func.func public @main(%w: tensor<8xf32>, %v: tensor<4x8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}, tensor<4x8xf32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %b2 = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %h = stablehlo.multiply %v, %b2 : tensor<4x8xf32>
    return %g, %h : tensor<8xf32>, tensor<4x8xf32>
  }
}

// -----

// Gradients marked with the custom call (what amp.value_and_grad and
// amp.train_step emit): the call is removed and its users (here an SGD-like
// update) read the unscaled values. An f16 gradient is unscaled and checked
// in f32, then converted back for its users.

// CHECK-LABEL: module @marker
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[V:[^:]*]]: tensor<4xf16>, %[[SEED:[^:]*]]: tensor<f32>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}, %[[COUNTER:[^:]*]]: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<4xf16>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// CHECK: %[[INV:.*]] = stablehlo.divide %{{.*}}, %[[SCALE]] : tensor<f32>
// CHECK: %[[G:.*]] = stablehlo.multiply %[[W]], %{{.*}} : tensor<8xf32>
// CHECK: %[[H:.*]] = stablehlo.multiply %[[V]], %{{.*}} : tensor<4xf16>
// CHECK-NOT: custom_call
// CHECK: %[[IB0:.*]] = stablehlo.broadcast_in_dim %[[INV]], dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK-NEXT: %[[U0:.*]] = stablehlo.multiply %[[G]], %[[IB0]] : tensor<8xf32>
// CHECK-NOT: custom_call
// CHECK: %[[H32:.*]] = stablehlo.convert %[[H]] : (tensor<4xf16>) -> tensor<4xf32>
// CHECK-NEXT: %[[IB1:.*]] = stablehlo.broadcast_in_dim %[[INV]], dims = [] : (tensor<f32>) -> tensor<4xf32>
// CHECK-NEXT: %[[U1:.*]] = stablehlo.multiply %[[H32]], %[[IB1]] : tensor<4xf32>
// CHECK-NEXT: %[[F1:.*]] = stablehlo.is_finite %[[U1]] : (tensor<4xf32>) -> tensor<4xi1>
// CHECK: %[[U1H:.*]] = stablehlo.convert %[[U1]] : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NOT: custom_call
// CHECK: %[[N0:.*]] = stablehlo.subtract %[[W]], %[[U0]] : tensor<8xf32>
// CHECK-NEXT: %[[N1:.*]] = stablehlo.subtract %[[V]], %[[U1H]] : tensor<4xf16>
// CHECK-NOT: custom_call
// CHECK: return %[[N0]], %[[N1]], %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<4xf16>, tensor<i1>, tensor<f32>, tensor<i32>

// mode=none: the call is still removed; its users read the gradients as
// they are.
// NONE-LABEL: module @marker
// NONE: %[[G:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<8xf32>
// NONE-NOT: custom_call
// NONE: stablehlo.subtract %{{.*}}, %[[G]] : tensor<8xf32>
// NONE-NOT: custom_call
// NONE: return
module @marker {
  func.func public @main(%w: tensor<8xf32>, %v: tensor<4xf16>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32>, tensor<4xf16>) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %s = stablehlo.convert %seed : (tensor<f32>) -> tensor<f16>
    %b2 = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f16>) -> tensor<4xf16>
    %h = stablehlo.multiply %v, %b2 : tensor<4xf16>
    %m:2 = stablehlo.custom_call @stablehlo_amp.gradients(%g, %h) {api_version = 4 : i32} : (tensor<8xf32>, tensor<4xf16>) -> (tensor<8xf32>, tensor<4xf16>)
    %n = stablehlo.subtract %w, %m#0 : tensor<8xf32>
    %o = stablehlo.subtract %v, %m#1 : tensor<4xf16>
    return %n, %o : tensor<8xf32>, tensor<4xf16>
  }
}

// -----

// One predicate: is_finite of every unscaled gradient, reduced with AND over
// all dimensions (a scalar needs no reduce), the flags combined with AND.

// CHECK-LABEL: module @all_finite
// CHECK: func.func public @main(%[[V:[^:]*]]: tensor<4x8xf32>, %[[X:[^:]*]]: tensor<f32>,
// CHECK: %[[INV:.*]] = stablehlo.divide
// CHECK: %[[G0:.*]] = stablehlo.multiply %[[V]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[G1:.*]] = stablehlo.multiply %[[X]], %{{.*}} : tensor<f32>
// CHECK: %[[U0:.*]] = stablehlo.multiply %[[G0]], %{{.*}} : tensor<4x8xf32>
// CHECK-NEXT: %[[F0:.*]] = stablehlo.is_finite %[[U0]] : (tensor<4x8xf32>) -> tensor<4x8xi1>
// CHECK-NEXT: %[[T0:.*]] = stablehlo.constant dense<true> : tensor<i1>
// CHECK-NEXT: %[[R0:.*]] = stablehlo.reduce(%[[F0]] init: %[[T0]]) applies stablehlo.and across dimensions = [0, 1] : (tensor<4x8xi1>, tensor<i1>) -> tensor<i1>
// CHECK-NEXT: %[[U1:.*]] = stablehlo.multiply %[[G1]], %[[INV]] : tensor<f32>
// CHECK-NEXT: %[[F1:.*]] = stablehlo.is_finite %[[U1]] : (tensor<f32>) -> tensor<i1>
// CHECK-NEXT: %[[FINITE:.*]] = stablehlo.and %[[R0]], %[[F1]] : tensor<i1>
// CHECK-NOT: stablehlo.reduce
// CHECK: return %[[U0]], %[[U1]], %[[FINITE]], %{{[^,]*}}, %{{[^,]*}} : tensor<4x8xf32>, tensor<f32>, tensor<i1>, tensor<f32>, tensor<i32>
module @all_finite {
  func.func public @main(%v: tensor<4x8xf32>, %x: tensor<f32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<4x8xf32> {amp.gradient}, tensor<f32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %g = stablehlo.multiply %v, %b : tensor<4x8xf32>
    %h = stablehlo.multiply %x, %seed : tensor<f32>
    return %g, %h : tensor<4x8xf32>, tensor<f32>
  }
}

// -----

// Results marked amp.state_of = N keep the old argument N when a gradient is
// not finite; a bf16 argument returned in f32 is converted (exactly) for the
// select.

// CHECK-LABEL: module @state_select
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[V:[^:]*]]: tensor<8xbf16>, %[[SEED:[^:]*]]: tensor<f32>, %{{[^:]*}}: tensor<f32> {amp.loss_scale}, %{{[^:]*}}: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// CHECK: %[[NW:.*]] = stablehlo.subtract %[[W]], %{{.*}} : tensor<8xf32>
// CHECK: %[[NV:.*]] = stablehlo.subtract %{{.*}}, %{{.*}} : tensor<8xf32>
// CHECK: %[[FINITE:.*]] = stablehlo.reduce
// CHECK: %[[SW:.*]] = stablehlo.select %[[FINITE]], %[[NW]], %[[W]] : tensor<i1>, tensor<8xf32>
// CHECK-NEXT: %[[VF:.*]] = stablehlo.convert %[[V]] : (tensor<8xbf16>) -> tensor<8xf32>
// CHECK-NEXT: %[[SV:.*]] = stablehlo.select %[[FINITE]], %[[NV]], %[[VF]] : tensor<i1>, tensor<8xf32>
// CHECK: return %{{[^,]*}}, %[[SW]], %[[SV]], %[[FINITE]], %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>

// STATIC-LABEL: module @state_select
// STATIC: %[[FINITE:.*]] = stablehlo.reduce
// STATIC: %[[SW:.*]] = stablehlo.select %[[FINITE]], %{{.*}}, %{{.*}} : tensor<i1>, tensor<8xf32>
// STATIC: %[[SV:.*]] = stablehlo.select %[[FINITE]], %{{.*}}, %{{.*}} : tensor<i1>, tensor<8xf32>
// STATIC-NEXT: return %{{[^,]*}}, %[[SW]], %[[SV]], %[[FINITE]] : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<i1>

// mode=none checks and does not select: the new state is returned as made.
// NONE-LABEL: module @state_select
// NONE: %[[NW:.*]] = stablehlo.subtract
// NONE: %[[NV:.*]] = stablehlo.subtract
// NONE: %[[FINITE:.*]] = stablehlo.reduce
// NONE-NOT: stablehlo.select
// NONE: return %{{[^,]*}}, %[[NW]], %[[NV]], %[[FINITE]] : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<i1>
module @state_select {
  func.func public @main(%w: tensor<8xf32>, %v: tensor<8xbf16>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}, tensor<8xf32> {amp.state_of = 0 : i64}, tensor<8xf32> {amp.state_of = 1 : i64}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %nw = stablehlo.subtract %w, %g : tensor<8xf32>
    %vf = stablehlo.convert %v : (tensor<8xbf16>) -> tensor<8xf32>
    %nv = stablehlo.subtract %vf, %g : tensor<8xf32>
    return %g, %nw, %nv : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}

// -----

// Ops that compute only state results read the selected new values, not the
// unselected ones: the parameter update reads the new moment through its
// select, so the new moment has one reader and XLA can update a donated
// moment buffer in place instead of copying the old one for a second reader.

// CHECK-LABEL: module @state_readers
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[M:[^:]*]]: tensor<8xf32>,
// CHECK: %[[G:.*]] = stablehlo.multiply %[[W]], %{{.*}} : tensor<8xf32>
// CHECK: %[[NM:.*]] = stablehlo.add %[[M]], %[[G]] : tensor<8xf32>
// CHECK: %[[SM:.*]] = stablehlo.select %[[FINITE:[^,]*]], %[[NM]], %[[M]] : tensor<i1>, tensor<8xf32>
// CHECK: %[[UPD:.*]] = stablehlo.multiply %[[SM]], %{{.*}} : tensor<8xf32>
// CHECK: %[[NW:.*]] = stablehlo.subtract %[[W]], %[[UPD]] : tensor<8xf32>
// CHECK: %[[SW:.*]] = stablehlo.select %[[FINITE]], %[[NW]], %[[W]] : tensor<i1>, tensor<8xf32>
// CHECK: return %{{[^,]*}}, %[[SW]], %[[SM]], %[[FINITE]],
module @state_readers {
  func.func public @main(%w: tensor<8xf32>, %m: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}, tensor<8xf32> {amp.state_of = 0 : i64}, tensor<8xf32> {amp.state_of = 1 : i64}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %nm = stablehlo.add %m, %g : tensor<8xf32>
    %lr = stablehlo.constant dense<1.000000e-01> : tensor<8xf32>
    %upd = stablehlo.multiply %nm, %lr : tensor<8xf32>
    %nw = stablehlo.subtract %w, %upd : tensor<8xf32>
    return %g, %nw, %nm : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}

// -----

// The dynamic update, in the graph: counter + 1 reaching growth-interval
// grows the scale by growth-factor if the grown scale is finite and at most
// max-scale (the counter resets either way); on overflow the scale is
// max(scale * backoff-factor, min-scale) and the counter resets.

// CHECK-LABEL: module @dynamic_update
// CHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[SEED:[^:]*]]: tensor<f32>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}, %[[COUNTER:[^:]*]]: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// CHECK: %[[FINITE:.*]] = stablehlo.reduce
// CHECK: %[[C1:.*]] = stablehlo.constant dense<1> : tensor<i32>
// CHECK-NEXT: %[[NEXT:.*]] = stablehlo.add %[[COUNTER]], %[[C1]] : tensor<i32>
// CHECK-NEXT: %[[INTERVAL:.*]] = stablehlo.constant dense<2000> : tensor<i32>
// CHECK-NEXT: %[[AT:.*]] = stablehlo.compare GE, %[[NEXT]], %[[INTERVAL]] : (tensor<i32>, tensor<i32>) -> tensor<i1>
// CHECK-NEXT: %[[GF:.*]] = stablehlo.constant dense<2.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[GROWN:.*]] = stablehlo.multiply %[[SCALE]], %[[GF]] : tensor<f32>
// CHECK-NEXT: %[[GFIN:.*]] = stablehlo.is_finite %[[GROWN]] : (tensor<f32>) -> tensor<i1>
// CHECK-NEXT: %[[MAX:.*]] = stablehlo.constant dense<0x4B800000> : tensor<f32>
// CHECK-NEXT: %[[LE:.*]] = stablehlo.compare LE, %[[GROWN]], %[[MAX]] : (tensor<f32>, tensor<f32>) -> tensor<i1>
// CHECK-NEXT: %[[CAN:.*]] = stablehlo.and %[[GFIN]], %[[LE]] : tensor<i1>
// CHECK-NEXT: %[[GROW:.*]] = stablehlo.and %[[AT]], %[[CAN]] : tensor<i1>
// CHECK-NEXT: %[[FSCALE:.*]] = stablehlo.select %[[GROW]], %[[GROWN]], %[[SCALE]] : tensor<i1>, tensor<f32>
// CHECK-NEXT: %[[C0:.*]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK-NEXT: %[[FCOUNTER:.*]] = stablehlo.select %[[AT]], %[[C0]], %[[NEXT]] : tensor<i1>, tensor<i32>
// CHECK-NEXT: %[[BF:.*]] = stablehlo.constant dense<5.000000e-01> : tensor<f32>
// CHECK-NEXT: %[[HALF:.*]] = stablehlo.multiply %[[SCALE]], %[[BF]] : tensor<f32>
// CHECK-NEXT: %[[MIN:.*]] = stablehlo.constant dense<1.000000e+00> : tensor<f32>
// CHECK-NEXT: %[[BACKED:.*]] = stablehlo.maximum %[[HALF]], %[[MIN]] : tensor<f32>
// CHECK-NEXT: %[[NSCALE:.*]] = stablehlo.select %[[FINITE]], %[[FSCALE]], %[[BACKED]] : tensor<i1>, tensor<f32>
// CHECK-NEXT: %[[Z:.*]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK-NEXT: %[[NCOUNTER:.*]] = stablehlo.select %[[FINITE]], %[[FCOUNTER]], %[[Z]] : tensor<i1>, tensor<i32>
// CHECK-NEXT: return %{{[^,]*}}, %[[FINITE]], %[[NSCALE]], %[[NCOUNTER]] : tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>

// The options reach the constants.
// OPT-LABEL: module @dynamic_update
// OPT: stablehlo.constant dense<100> : tensor<i32>
// OPT: stablehlo.constant dense<4.000000e+00> : tensor<f32>
// OPT: stablehlo.constant dense<6.553600e+04> : tensor<f32>
// OPT: stablehlo.constant dense<2.500000e-01> : tensor<f32>
// OPT: stablehlo.constant dense<3.125000e-02> : tensor<f32>
// OPT: return

// STATIC-LABEL: module @dynamic_update
// STATIC-NOT: stablehlo.maximum
// STATIC: return
module @dynamic_update {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    return %g : tensor<8xf32>
  }
}

// -----

// Gradients wider than f32 (f64 under x64) are unscaled and checked in their
// own dtype: the f32 reciprocal is widened, the gradient is not narrowed.

// CHECK-LABEL: module @f64_gradient
// CHECK: %[[INV:.*]] = stablehlo.divide %{{.*}}, %{{.*}} : tensor<f32>
// CHECK: %[[G:.*]] = stablehlo.multiply %{{.*}}, %{{.*}} : tensor<8xf64>
// CHECK: %[[INV64:.*]] = stablehlo.convert %[[INV]] : (tensor<f32>) -> tensor<f64>
// CHECK-NEXT: %[[B:.*]] = stablehlo.broadcast_in_dim %[[INV64]], dims = [] : (tensor<f64>) -> tensor<8xf64>
// CHECK-NEXT: %[[U:.*]] = stablehlo.multiply %[[G]], %[[B]] : tensor<8xf64>
// CHECK-NEXT: stablehlo.is_finite %[[U]] : (tensor<8xf64>) -> tensor<8xi1>
// CHECK-NOT: tensor<8xf32>
// CHECK: return %[[U]],
module @f64_gradient {
  func.func public @main(%w: tensor<8xf64>, %seed: tensor<f64> {amp.loss_seed}) -> (tensor<8xf64> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f64>) -> tensor<8xf64>
    %g = stablehlo.multiply %w, %b : tensor<8xf64>
    return %g : tensor<8xf64>
  }
}

//--- indices.mlir

// Nothing marked: seed-arg, gradient-results and state-results name the
// argument and results. An f16 seed takes the scale converted to f16.

// IDX-LABEL: module @indices
// IDX: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[V:[^:]*]]: tensor<4xf32>, %[[SEED:[^:]*]]: tensor<f16>, %[[SCALE:[^:]*]]: tensor<f32> {amp.loss_scale}, %[[COUNTER:[^:]*]]: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<4xf32>, tensor<8xf32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter})
// IDX-NEXT: %[[SCALE16:.*]] = stablehlo.convert %[[SCALE]] : (tensor<f32>) -> tensor<f16>
// IDX-NEXT: %[[SCALED:.*]] = stablehlo.multiply %[[SEED]], %[[SCALE16]] : tensor<f16>
// IDX: %[[SEED32:.*]] = stablehlo.convert %[[SCALED]] : (tensor<f16>) -> tensor<f32>
// IDX: %[[G:.*]] = stablehlo.multiply %[[W]], %{{.*}} : tensor<8xf32>
// IDX: %[[H:.*]] = stablehlo.multiply %[[V]], %{{.*}} : tensor<4xf32>
// IDX: %[[NW:.*]] = stablehlo.subtract %[[W]], %[[G]] : tensor<8xf32>
// IDX: %[[U0:.*]] = stablehlo.multiply %[[G]], %{{.*}} : tensor<8xf32>
// IDX: %[[U1:.*]] = stablehlo.multiply %[[H]], %{{.*}} : tensor<4xf32>
// IDX: %[[FINITE:.*]] = stablehlo.and
// IDX-NEXT: %[[SW:.*]] = stablehlo.select %[[FINITE]], %[[NW]], %[[W]] : tensor<i1>, tensor<8xf32>
// IDX: return %[[U0]], %[[U1]], %[[SW]], %[[FINITE]], %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<4xf32>, tensor<8xf32>, tensor<i1>, tensor<f32>, tensor<i32>
module @indices {
  func.func public @main(%w: tensor<8xf32>, %v: tensor<4xf32>, %seed: tensor<f16>) -> (tensor<8xf32>, tensor<4xf32>, tensor<8xf32>) {
    %s = stablehlo.convert %seed : (tensor<f16>) -> tensor<f32>
    %b = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %b2 = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %h = stablehlo.multiply %v, %b2 : tensor<4xf32>
    %nw = stablehlo.subtract %w, %g : tensor<8xf32>
    return %g, %h, %nw : tensor<8xf32>, tensor<4xf32>, tensor<8xf32>
  }
}

//--- no_seed.mlir

// ERR-SEED: :[[# @LINE + 2]]:3{{\)?}}: error: no loss seed argument: mark the loss cotangent argument with 'amp.loss_seed' or pass seed-arg=N
module @no_seed {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32>) -> (tensor<8xf32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    return %g : tensor<8xf32>
  }
}
// ERR-SEED-NOT: func.func

//--- check_state.mlir

// check-state=true: the step is also skipped when a float value of its new
// state is not finite (the integer counter is not checked); that check is
// the last result, and the scale's update follows the gradients alone.
// STATECHECK: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[N:[^:]*]]: tensor<i32>, %{{[^:]*}}: tensor<f32>, %{{[^:]*}}: tensor<f32> {amp.loss_scale}, %{{[^:]*}}: tensor<i32> {amp.loss_scale_counter}) -> (tensor<8xf32>, tensor<8xf32>, tensor<i32>, tensor<i1> {amp.grads_finite}, tensor<f32> {amp.loss_scale}, tensor<i32> {amp.loss_scale_counter}, tensor<i1> {amp.state_finite})
// STATECHECK: %[[NW:.*]] = stablehlo.divide %[[W]], %{{.*}} : tensor<8xf32>
// STATECHECK: %[[GRADS:.*]] = stablehlo.reduce
// STATECHECK: %[[ISF:.*]] = stablehlo.is_finite %[[NW]] : (tensor<8xf32>) -> tensor<8xi1>
// STATECHECK: %[[STATE:.*]] = stablehlo.reduce(%[[ISF]]
// STATECHECK-NOT: stablehlo.is_finite
// STATECHECK: %[[KEEP:.*]] = stablehlo.and %[[GRADS]], %[[STATE]] : tensor<i1>
// STATECHECK: %[[SW:.*]] = stablehlo.select %[[KEEP]], %[[NW]], %[[W]] : tensor<i1>, tensor<8xf32>
// STATECHECK: %[[SN:.*]] = stablehlo.select %[[KEEP]], %{{.*}}, %[[N]] : tensor<i1>, tensor<i32>
// STATECHECK: %[[SCALE:.*]] = stablehlo.select %[[GRADS]],
// STATECHECK: return %{{[^,]*}}, %[[SW]], %[[SN]], %[[GRADS]], %[[SCALE]], %{{[^,]*}}, %[[STATE]] :
// mode=none: without a loss scale the step skips nothing (the new state is
// returned as made), and checks its gradients only with check-grads=true;
// check-state=true skips a step whose gradients or new state are not
// finite.
// UNCHECKED-STATE: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[N:[^:]*]]: tensor<i32>, %{{[^:]*}}: tensor<f32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<i32>) {
// UNCHECKED-STATE-NOT: stablehlo.is_finite
// UNCHECKED-STATE-NOT: stablehlo.reduce
// UNCHECKED-STATE-NOT: stablehlo.select
// UNCHECKED-STATE: return %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}} : tensor<8xf32>, tensor<8xf32>, tensor<i32>
// NONE-STATE: func.func public @main(%[[W:[^:]*]]: tensor<8xf32>, %[[N:[^:]*]]: tensor<i32>, %{{[^:]*}}: tensor<f32>) -> (tensor<8xf32>, tensor<8xf32>, tensor<i32>, tensor<i1> {amp.grads_finite})
// NONE-STATE: %[[NW:.*]] = stablehlo.divide %[[W]], %{{.*}} : tensor<8xf32>
// NONE-STATE: %[[GRADS:.*]] = stablehlo.reduce
// NONE-STATE-NOT: stablehlo.select
// NONE-STATE: return %{{[^,]*}}, %[[NW]], %{{[^,]*}}, %[[GRADS]] :
// NONE-SKIP: %[[NW:.*]] = stablehlo.divide
// NONE-SKIP: %[[KEEP:.*]] = stablehlo.and
// NONE-SKIP: %[[SW:.*]] = stablehlo.select %[[KEEP]], %[[NW]],
// NONE-SKIP: return %{{[^,]*}}, %[[SW]],
module @check_state {
  func.func public @main(%w: tensor<8xf32>, %n: tensor<i32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}, tensor<8xf32> {amp.state_of = 0 : i64}, tensor<i32> {amp.state_of = 1 : i64}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %nw = stablehlo.divide %w, %g : tensor<8xf32>
    %one = stablehlo.constant dense<1> : tensor<i32>
    %nn = stablehlo.add %n, %one : tensor<i32>
    return %g, %nw, %nn : tensor<8xf32>, tensor<8xf32>, tensor<i32>
  }
}

//--- no_gradients.mlir

// ERR-GRAD: :[[# @LINE + 2]]:3{{\)?}}: error: no gradients: mark gradient results with 'amp.gradient', pass gradient-results=..., or wrap them in a custom_call @stablehlo_amp.gradients
module @no_gradients {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> tensor<8xf32> {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    return %g : tensor<8xf32>
  }
}
// ERR-GRAD-NOT: func.func

//--- state_mismatch.mlir

// ERR-STATE: :[[# @LINE + 2]]:3{{\)?}}: error: state result #1 ('tensor<4xf32>') does not have the type of argument #0 ('tensor<8xf32>')
module @state_mismatch {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}, tensor<4xf32> {amp.state_of = 0 : i64}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    %s = stablehlo.slice %g [0:4] : (tensor<8xf32>) -> tensor<4xf32>
    return %g, %s : tensor<8xf32>, tensor<4xf32>
  }
}
// ERR-STATE-NOT: func.func

//--- valid.mlir

// A valid input: only the bad option value is reported, and nothing is
// printed.
// ERR-MODE: error: invalid option 'mode': unknown value 'bogus' (accepted: dynamic, static, none)
// ERR-MODE-NOT: func.func
// ERR-BACKOFF: error: invalid option 'backoff-factor': must be in (0, 1]
// ERR-BACKOFF-NOT: func.func
// ERR-INTERVAL: error: invalid option 'growth-interval': must be at least 1
// ERR-INTERVAL-NOT: func.func
// ERR-MIN: error: invalid option 'min-scale': must be finite and positive, got 0.0
// ERR-MIN-NOT: func.func
module @valid {
  func.func public @main(%w: tensor<8xf32>, %seed: tensor<f32> {amp.loss_seed}) -> (tensor<8xf32> {amp.gradient}) {
    %b = stablehlo.broadcast_in_dim %seed, dims = [] : (tensor<f32>) -> tensor<8xf32>
    %g = stablehlo.multiply %w, %b : tensor<8xf32>
    return %g : tensor<8xf32>
  }
}
