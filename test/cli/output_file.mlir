// -o writes the whole output or nothing.

// A path that cannot be created: exit 2, one clear line, no file.
// RUN: rm -rf %t.d && mkdir -p %t.d/subdir && echo not-a-directory > %t.d/file
// RUN: sh -c 'amp-opt %s --target gpu --dot-result f32 -o %t.d/file/out.mlir; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=NOTDIR
// NOTDIR: amp-opt: error: cannot write {{.*}}/file/out.mlir: Not a directory
// NOTDIR-NEXT: exit=2

// Writing over a directory fails without leaving a temporary file behind.
// RUN: sh -c 'amp-opt %s --target gpu --dot-result f32 -o %t.d/subdir; echo "exit=$?"' 2>&1 | FileCheck %s --check-prefix=ISDIR
// ISDIR: amp-opt: error: cannot write {{.*}}/subdir: Is a directory
// ISDIR-NEXT: exit=2
// RUN: ls -A %t.d | FileCheck %s --check-prefix=LEFTOVERS
// LEFTOVERS-NOT: amp-opt
// LEFTOVERS: file
// LEFTOVERS-NEXT: subdir
// LEFTOVERS-NOT: {{.}}

// A good run replaces an existing file.
// RUN: echo previous > %t.d/out.mlir
// RUN: amp-opt %s --target gpu --dot-result f32 -o %t.d/out.mlir
// RUN: FileCheck %s --check-prefix=WRITTEN --input-file %t.d/out.mlir
// WRITTEN-NOT: previous
// WRITTEN: stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>

// A new output file honours the umask (0644 under 022), although it is
// written through a private temporary file.
// RUN: rm -f %t.d/mode.mlir
// RUN: sh -c 'umask 022 && amp-opt %s --target gpu --dot-result f32 -o %t.d/mode.mlir'
// RUN: stat -c %%a %t.d/mode.mlir | FileCheck %s --check-prefix=MODE
// MODE: 644

func.func public @main(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [0], precision = [DEFAULT, DEFAULT] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
