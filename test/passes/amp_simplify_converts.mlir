// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-simplify-converts)' | FileCheck %s

// An identity convert is removed.

// CHECK-LABEL: func.func public @identity(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>) -> tensor<4xf32>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[A:.*]] = stablehlo.add %[[X]], %[[X]] : tensor<4xf32>
// CHECK-NEXT: return %[[A]] : tensor<4xf32>
func.func public @identity(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.convert %arg0 : tensor<4xf32>
  %1 = stablehlo.add %0, %0 : tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// bf16 -> f32 -> bf16 is exact: both converts go.

// CHECK-LABEL: func.func public @exact_round_trip(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xbf16>) -> tensor<4xbf16>
// CHECK-NOT: stablehlo.convert
// CHECK: %[[A:.*]] = stablehlo.add %[[X]], %[[X]] : tensor<4xbf16>
// CHECK-NEXT: return %[[A]] : tensor<4xbf16>
func.func public @exact_round_trip(%arg0: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xbf16>
  %2 = stablehlo.add %1, %1 : tensor<4xbf16>
  return %2 : tensor<4xbf16>
}

// -----

// An identity convert and an exact round trip in one chain (the example of
// the pass description).

// CHECK-LABEL: func.func public @chain(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xbf16>) -> tensor<4xbf16>
// CHECK-NEXT: return %[[X]] : tensor<4xbf16>
func.func public @chain(%arg0: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xbf16>
  %2 = stablehlo.convert %1 : tensor<4xbf16>
  return %2 : tensor<4xbf16>
}

// -----

// f32 -> bf16 -> f32 rounds: it is kept.

// CHECK-LABEL: func.func public @lossy_round_trip(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>) -> tensor<4xf32>
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[F:.*]] = stablehlo.convert %[[B]] : (tensor<4xbf16>) -> tensor<4xf32>
// CHECK-NEXT: return %[[F]] : tensor<4xf32>
func.func public @lossy_round_trip(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = stablehlo.convert %0 : (tensor<4xbf16>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// i32 -> f32 -> i32 is not exact either (f32 holds 24 bits of mantissa).

// CHECK-LABEL: func.func public @integer_round_trip(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xi32>) -> tensor<4xi32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.convert %[[X]] : (tensor<4xi32>) -> tensor<4xf32>
// CHECK-NEXT: %[[I:.*]] = stablehlo.convert %[[F]] : (tensor<4xf32>) -> tensor<4xi32>
// CHECK-NEXT: return %[[I]] : tensor<4xi32>
func.func public @integer_round_trip(%arg0: tensor<4xi32>) -> tensor<4xi32> {
  %0 = stablehlo.convert %arg0 : (tensor<4xi32>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xi32>
  return %1 : tensor<4xi32>
}

// -----

// bf16 -> f32 is exact, so bf16 -> f32 -> f16 rounds once: one convert
// bf16 -> f16.

// CHECK-LABEL: func.func public @widen_then_narrow(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xbf16>) -> tensor<4xf16>
// CHECK-NEXT: %[[H:.*]] = stablehlo.convert %[[X]] : (tensor<4xbf16>) -> tensor<4xf16>
// CHECK-NEXT: return %[[H]] : tensor<4xf16>
func.func public @widen_then_narrow(%arg0: tensor<4xbf16>) -> tensor<4xf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xf16>
  return %1 : tensor<4xf16>
}

// -----

// f32 -> bf16 rounds first, so f32 -> bf16 -> f16 is not f32 -> f16: kept.

// CHECK-LABEL: func.func public @narrow_then_narrow(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[H:.*]] = stablehlo.convert %[[B]] : (tensor<4xbf16>) -> tensor<4xf16>
// CHECK-NEXT: return %[[H]] : tensor<4xf16>
func.func public @narrow_then_narrow(%arg0: tensor<4xf32>) -> tensor<4xf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = stablehlo.convert %0 : (tensor<4xbf16>) -> tensor<4xf16>
  return %1 : tensor<4xf16>
}

// -----

// Two converts of one value to one type become one.

// CHECK-LABEL: func.func public @duplicates(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[A:.*]] = stablehlo.add %[[B]], %[[B]] : tensor<4xbf16>
// CHECK-NEXT: return %[[A]] : tensor<4xbf16>
func.func public @duplicates(%arg0: tensor<4xf32>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %2 = stablehlo.add %0, %1 : tensor<4xbf16>
  return %2 : tensor<4xbf16>
}

// -----

// The kept convert dominates every use, including uses before the second
// convert's position.

// CHECK-LABEL: func.func public @duplicates_apart(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[N:.*]] = stablehlo.negate %[[B]] : tensor<4xbf16>
// CHECK-NEXT: %[[A:.*]] = stablehlo.add %[[N]], %[[B]] : tensor<4xbf16>
// CHECK-NEXT: return %[[A]] : tensor<4xbf16>
func.func public @duplicates_apart(%arg0: tensor<4xf32>) -> tensor<4xbf16> {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = stablehlo.negate %0 : tensor<4xbf16>
  %2 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %3 = stablehlo.add %1, %2 : tensor<4xbf16>
  return %3 : tensor<4xbf16>
}

// -----

// Converts of one value to different types are not duplicates.

// CHECK-LABEL: func.func public @different_targets(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>)
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[H:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: return %[[B]], %[[H]] : tensor<4xbf16>, tensor<4xf16>
func.func public @different_targets(%arg0: tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xf16>) {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf16>
  return %0, %1 : tensor<4xbf16>, tensor<4xf16>
}

// -----

// The widening convert of a removed round trip stays while something else
// uses it.

// CHECK-LABEL: func.func public @still_used(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xbf16>)
// CHECK-NEXT: %[[F:.*]] = stablehlo.convert %[[X]] : (tensor<4xbf16>) -> tensor<4xf32>
// CHECK-NEXT: %[[E:.*]] = stablehlo.exponential %[[F]] : tensor<4xf32>
// CHECK-NEXT: return %[[X]], %[[E]] : tensor<4xbf16>, tensor<4xf32>
func.func public @still_used(%arg0: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<4xf32>) {
  %0 = stablehlo.convert %arg0 : (tensor<4xbf16>) -> tensor<4xf32>
  %1 = stablehlo.convert %0 : (tensor<4xf32>) -> tensor<4xbf16>
  %2 = stablehlo.exponential %0 : tensor<4xf32>
  return %1, %2 : tensor<4xbf16>, tensor<4xf32>
}

// -----

// Inside regions too; converts in different regions are not merged (neither
// would dominate the other's uses).

// CHECK-LABEL: func.func public @regions(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>, %[[P:[^:]*]]: tensor<i1>, %[[Y:[^:]*]]: tensor<4xbf16>)
// CHECK: "stablehlo.if"(%[[P]]) ({
// CHECK-NEXT: %[[B1:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: stablehlo.return %[[B1]] : tensor<4xbf16>
// CHECK-NEXT: }, {
// CHECK-NEXT: %[[B2:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[N:.*]] = stablehlo.negate %[[B2]] : tensor<4xbf16>
// CHECK-NEXT: %[[A:.*]] = stablehlo.add %[[N]], %[[Y]] : tensor<4xbf16>
// CHECK-NEXT: stablehlo.return %[[A]] : tensor<4xbf16>
func.func public @regions(%arg0: tensor<4xf32>, %arg1: tensor<i1>, %arg2: tensor<4xbf16>) -> tensor<4xbf16> {
  %0 = "stablehlo.if"(%arg1) ({
    %1 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
    stablehlo.return %1 : tensor<4xbf16>
  }, {
    %1 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
    %2 = stablehlo.negate %1 : tensor<4xbf16>
    %3 = stablehlo.convert %arg2 : (tensor<4xbf16>) -> tensor<4xf32>
    %4 = stablehlo.convert %3 : (tensor<4xf32>) -> tensor<4xbf16>
    %5 = stablehlo.add %2, %4 : tensor<4xbf16>
    stablehlo.return %5 : tensor<4xbf16>
  }) : (tensor<i1>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

// A convert inside a region reuses an equal convert of the enclosing block
// that comes before the region's op (it dominates the region); a convert in
// a region is not reused by one after the op in the enclosing block.

// CHECK-LABEL: func.func public @enclosing_block(
// CHECK-SAME: %[[X:[^:]*]]: tensor<4xf32>, %[[P:[^:]*]]: tensor<i1>)
// CHECK-NEXT: %[[B:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xbf16>
// CHECK-NEXT: %[[R:.*]] = "stablehlo.if"(%[[P]]) ({
// CHECK-NEXT: %[[N:.*]] = stablehlo.negate %[[B]] : tensor<4xbf16>
// CHECK-NEXT: stablehlo.return %[[N]] : tensor<4xbf16>
// CHECK-NEXT: }, {
// CHECK-NEXT: %[[H:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: %[[HB:.*]] = stablehlo.convert %[[H]] : (tensor<4xf16>) -> tensor<4xbf16>
// CHECK-NEXT: stablehlo.return %[[HB]] : tensor<4xbf16>
// CHECK-NEXT: })
// CHECK-NEXT: %[[H2:.*]] = stablehlo.convert %[[X]] : (tensor<4xf32>) -> tensor<4xf16>
// CHECK-NEXT: %[[A:.*]] = stablehlo.add %[[R]], %[[B]] : tensor<4xbf16>
// CHECK-NEXT: return %[[A]], %[[H2]] : tensor<4xbf16>, tensor<4xf16>
func.func public @enclosing_block(%arg0: tensor<4xf32>, %arg1: tensor<i1>) -> (tensor<4xbf16>, tensor<4xf16>) {
  %0 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
  %1 = "stablehlo.if"(%arg1) ({
    %2 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xbf16>
    %3 = stablehlo.negate %2 : tensor<4xbf16>
    stablehlo.return %3 : tensor<4xbf16>
  }, {
    %2 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf16>
    %3 = stablehlo.convert %2 : (tensor<4xf16>) -> tensor<4xbf16>
    stablehlo.return %3 : tensor<4xbf16>
  }) : (tensor<i1>) -> tensor<4xbf16>
  %4 = stablehlo.convert %arg0 : (tensor<4xf32>) -> tensor<4xf16>
  %5 = stablehlo.add %1, %0 : tensor<4xbf16>
  return %5, %4 : tensor<4xbf16>, tensor<4xf16>
}
