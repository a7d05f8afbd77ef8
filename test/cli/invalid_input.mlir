// Invalid IR: `file:line:col: error:` with the line in this file (also in a
// later --split-input-file chunk), exit status 1, and no output file.

// RUN: rm -f %t.out
// RUN: sh -c 'amp-opt %s --split-input-file --target gpu; echo "exit=$?"' 2>&1 | FileCheck %s
// RUN: sh -c 'amp-opt %s --target gpu -o %t.out; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=NOSPLIT
// RUN: test ! -e %t.out

// An output file that already exists is left as it was.
// RUN: echo previous > %t.kept
// RUN: not amp-opt %s --target gpu -o %t.kept
// RUN: FileCheck %s --check-prefix=KEPT --input-file %t.kept
// KEPT: previous

// Empty input is an error too.
// RUN: sh -c 'printf "" | amp-opt --target gpu; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=EMPTY
// EMPTY: <stdin>: error: empty input, expected a StableHLO module
// EMPTY-NEXT: exit=1

func.func public @undeclared(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  // CHECK: {{.*}}invalid_input.mlir:[[@LINE+2]]:29: error: use of undeclared SSA value name
  // NOSPLIT: {{.*}}invalid_input.mlir:[[@LINE+1]]:29: error: use of undeclared SSA value name
  %0 = stablehlo.add %arg0, %undefined : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Parsed, but rejected by the StableHLO verifier.
func.func public @verifier(%arg0: tensor<4xf32>, %arg1: tensor<5xf32>) -> tensor<4xf32> {
  // CHECK: {{.*}}invalid_input.mlir:[[@LINE+1]]:8: error: 'stablehlo.add' op requires the same shape for all operands and results
  %0 = stablehlo.add %arg0, %arg1 : (tensor<4xf32>, tensor<5xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A valid chunk is still printed; the exit status says something failed.
// CHECK: func.func public @valid
// CHECK: exit=1
// NOSPLIT-NEXT: exit=1
func.func public @valid(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  return %arg0 : tensor<4xf32>
}

// With -o, an invalid chunk under --split-input-file leaves no output file:
// a file is written whole or not at all.
// RUN: rm -f %t.split.out
// RUN: not amp-opt %s --split-input-file --target gpu -o %t.split.out
// RUN: test ! -e %t.split.out
