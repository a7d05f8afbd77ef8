// --emit: pretty (default), generic, bytecode.

// RUN: amp-opt %s --target gpu --dot-result f32 --emit generic -o %t.generic.mlir
// RUN: FileCheck %s --check-prefix=GENERIC --input-file %t.generic.mlir
// GENERIC: "builtin.module"() ({
// GENERIC: "func.func"() <{function_type = (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>, sym_name = "main", sym_visibility = "public"}> ({
// GENERIC-NEXT: ^bb0(%[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>):
// GENERIC-DAG: %[[WB:.*]] = "stablehlo.convert"(%[[W]]) : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// GENERIC-DAG: %[[XB:.*]] = "stablehlo.convert"(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// GENERIC: %[[D:.*]] = "stablehlo.dot_general"(%[[XB]], %[[WB]]) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]}> : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// GENERIC-NEXT: "func.return"(%[[D]]) : (tensor<4x8xf32>) -> ()

// Bytecode: MLIR bytecode magic, and reading it back gives the same module
// as the pretty output.
// RUN: amp-opt %s --target gpu --dot-result f32 --emit bytecode -o %t.mlirbc
// RUN: od -A n -c -N 4 %t.mlirbc | FileCheck %s --check-prefix=MAGIC
// MAGIC: M L 357 R
// RUN: amp-opt %s --target gpu --dot-result f32 -o %t.pretty.mlir
// RUN: amp-opt %t.mlirbc --pass-pipeline='builtin.module()' -o %t.roundtrip.mlir
// RUN: diff %t.pretty.mlir %t.roundtrip.mlir
// RUN: FileCheck %s --check-prefix=PRETTY --input-file %t.roundtrip.mlir
// PRETTY: func.func public @main
// PRETTY: stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>

// Generic input is accepted too (what jaxlib prints with
// print_generic_op_form=True).
// RUN: amp-opt %t.generic.mlir --pass-pipeline='builtin.module()' | diff %t.pretty.mlir -

func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
