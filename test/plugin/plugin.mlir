// The passes inside stock mlir-opt, through the plugin, on generic-form
// StableHLO (unregistered ops), as jaxlib prints it with
// print_generic_op_form=True.

// RUN: mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=gpu dot-result=f32})' | FileCheck %s
// RUN: mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=cpu})' | FileCheck %s --check-prefix=CPU
// RUN: mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-simplify-converts)' | FileCheck %s --check-prefix=SIMPLIFY

// Bad options are diagnosed on the module and fail the run.
// RUN: not mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf17,o=f32})' 2>&1 | FileCheck %s --check-prefix=BADPOLICY
// BADPOLICY: plugin.mlir:{{[0-9]+}}:{{[0-9]+}}: error: invalid policy: unknown dtype 'bf17' for key 'c' (accepted: f32, {{.*}}bf16{{.*}})
// RUN: not mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{target=xpu})' 2>&1 | FileCheck %s --check-prefix=BADTARGET
// BADTARGET: plugin.mlir:{{[0-9]+}}:{{[0-9]+}}: error: invalid option 'target': unknown target 'xpu' (accepted: cpu, gpu, tpu)
// RUN: not mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{level=O9})' 2>&1 | FileCheck %s --check-prefix=BADLEVEL
// BADLEVEL: plugin.mlir:{{[0-9]+}}:{{[0-9]+}}: error: invalid option 'level': unknown level 'O9' (accepted: O0, O1, O2, O3)
// RUN: not mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{decisions=route})' 2>&1 | FileCheck %s --check-prefix=BADDECISIONS
// BADDECISIONS: plugin.mlir:{{[0-9]+}}:{{[0-9]+}}: error: invalid option 'decisions': unknown decisions 'route' (accepted: exact, gate)
// The default on gpu, through the plugin too: a bf16 GEMM writes bf16.
// RUN: mlir-opt %s --load-pass-plugin=%amp_plugin --allow-unregistered-dialect --split-input-file --pass-pipeline='builtin.module(amp-insert-converts{policy=p=f32,c=bf16,o=f32 target=gpu decisions=exact})' | FileCheck %s --check-prefix=DEFAULT-DOT
// DEFAULT-DOT: "stablehlo.dot_general"({{.*}}) {{.*}}: (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>

// CHECK-LABEL: module @jit_f attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}
// CHECK-NEXT: func.func public @main(%[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>) -> (tensor<4x8xf32> {jax.result_info = "result"})
// CHECK-DAG: %[[WB:.*]] = "stablehlo.convert"(%[[W]]) : (tensor<8x8xf32>) -> tensor<8x8xbf16>
// CHECK-DAG: %[[XB:.*]] = "stablehlo.convert"(%[[X]]) : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK: %[[D:.*]] = "stablehlo.dot_general"(%[[XB]], %[[WB]]) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]}> : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[E:.*]] = "stablehlo.exponential"(%[[D]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK-NEXT: return %[[E]] : tensor<4x8xf32>
// The module, function and result attributes are kept (the result attribute
// is on the signature above).

// On cpu: NT-canonical, with a well-formed dot attribute and the precision
// config kept.
// CPU-LABEL: func.func public @main(
// CPU: %[[D:.*]] = "stablehlo.dot_general"(%{{.*}}, %{{.*}}) <{dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [2]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]}> : (tensor<1x4x8xbf16>, tensor<1x8x8xbf16>) -> tensor<1x4x8xf32>
// CPU-NEXT: %[[R:.*]] = "stablehlo.reshape"(%[[D]]) : (tensor<1x4x8xf32>) -> tensor<4x8xf32>
// CPU-NEXT: "stablehlo.exponential"(%[[R]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>

// amp-simplify-converts has nothing to remove here: the module comes out as
// it went in.
// SIMPLIFY-LABEL: func.func public @main(
// SIMPLIFY-SAME: %[[W:[^:]*]]: tensor<8x8xf32>, %[[X:[^:]*]]: tensor<4x8xf32>)
// SIMPLIFY-NEXT: %[[D:.*]] = "stablehlo.dot_general"(%[[X]], %[[W]]) {{.*}} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// SIMPLIFY-NEXT: %[[E:.*]] = "stablehlo.exponential"(%[[D]]) : (tensor<4x8xf32>) -> tensor<4x8xf32>
// SIMPLIFY-NEXT: return %[[E]] : tensor<4x8xf32>
"builtin.module"() <{sym_name = "jit_f"}> ({
  "func.func"() <{arg_attrs = [{}, {}], function_type = (tensor<8x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>, res_attrs = [{jax.result_info = "result"}], sym_name = "main", sym_visibility = "public"}> ({
  ^bb0(%arg0: tensor<8x8xf32>, %arg1: tensor<4x8xf32>):
    %0 = "stablehlo.dot_general"(%arg1, %arg0) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision DEFAULT>]}> : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %1 = "stablehlo.exponential"(%0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "func.return"(%1) : (tensor<4x8xf32>) -> ()
  }) : () -> ()
}) {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} : () -> ()

// -----

// A max reduction between two dots: the reduction body is retyped to bf16
// together with its operands, and the -inf init is re-encoded.

// CHECK-LABEL: func.func public @reduce_max(
// CHECK: %[[D:.*]] = "stablehlo.dot_general"({{.*}}) <{{.*}}> : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT: %[[DB:.*]] = "stablehlo.convert"(%[[D]]) : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT: %[[INIT:.*]] = "stablehlo.constant"() <{value = dense<0xFF80> : tensor<bf16>}> : () -> tensor<bf16>
// CHECK-NEXT: %[[M:.*]] = "stablehlo.reduce"(%[[DB]], %[[INIT]]) <{dimensions = array<i64: 1>}> ({
// CHECK-NEXT: ^bb0(%[[A:.*]]: tensor<bf16>, %[[B:.*]]: tensor<bf16>):
// CHECK-NEXT: %[[MAX:.*]] = "stablehlo.maximum"(%[[A]], %[[B]]) : (tensor<bf16>, tensor<bf16>) -> tensor<bf16>
// CHECK-NEXT: "stablehlo.return"(%[[MAX]]) : (tensor<bf16>) -> ()
// CHECK-NEXT: }) : (tensor<4x8xbf16>, tensor<bf16>) -> tensor<4xbf16>
// CHECK-NEXT: %[[BC:.*]] = "stablehlo.broadcast_in_dim"(%[[M]]) <{broadcast_dimensions = array<i64: 0>}> : (tensor<4xbf16>) -> tensor<4x8xbf16>
// CHECK-NEXT: "stablehlo.dot_general"(%[[BC]], %{{.*}}) {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4x8xf32>, tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>, sym_name = "reduce_max", sym_visibility = "public"}> ({
  ^bb0(%arg0: tensor<4x8xf32>, %arg1: tensor<8x8xf32>, %arg2: tensor<8x8xf32>):
    %0 = "stablehlo.dot_general"(%arg0, %arg1) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}> : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %1 = "stablehlo.constant"() <{value = dense<0xFF800000> : tensor<f32>}> : () -> tensor<f32>
    %2 = "stablehlo.reduce"(%0, %1) <{dimensions = array<i64: 1>}> ({
    ^bb0(%arg3: tensor<f32>, %arg4: tensor<f32>):
      %5 = "stablehlo.maximum"(%arg3, %arg4) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%5) : (tensor<f32>) -> ()
    }) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %3 = "stablehlo.broadcast_in_dim"(%2) <{broadcast_dimensions = array<i64: 0>}> : (tensor<4xf32>) -> tensor<4x8xf32>
    %4 = "stablehlo.dot_general"(%3, %arg2) <{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}> : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    "func.return"(%4) : (tensor<4x8xf32>) -> ()
  }) : () -> ()
}) : () -> ()

// -----

// amp-simplify-converts: an exact round trip goes, a lossy one stays.
// amp-insert-converts keeps these explicit converts as they are.

// CHECK-LABEL: func.func public @round_trips(
// CHECK-COUNT-4: "stablehlo.convert"
// CHECK-NOT: "stablehlo.convert"
// CHECK: return

// SIMPLIFY-LABEL: func.func public @round_trips(
// SIMPLIFY-SAME: %[[X:[^:]*]]: tensor<4xbf16>, %[[Y:[^:]*]]: tensor<4xf32>)
// SIMPLIFY-NEXT: %[[YB:.*]] = "stablehlo.convert"(%[[Y]]) : (tensor<4xf32>) -> tensor<4xbf16>
// SIMPLIFY-NEXT: %[[YF:.*]] = "stablehlo.convert"(%[[YB]]) : (tensor<4xbf16>) -> tensor<4xf32>
// SIMPLIFY-NEXT: return %[[X]], %[[YF]] : tensor<4xbf16>, tensor<4xf32>
"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4xbf16>, tensor<4xf32>) -> (tensor<4xbf16>, tensor<4xf32>), sym_name = "round_trips", sym_visibility = "public"}> ({
  ^bb0(%arg0: tensor<4xbf16>, %arg1: tensor<4xf32>):
    %0 = "stablehlo.convert"(%arg0) : (tensor<4xbf16>) -> tensor<4xf32>
    %1 = "stablehlo.convert"(%0) : (tensor<4xf32>) -> tensor<4xbf16>
    %2 = "stablehlo.convert"(%arg1) : (tensor<4xf32>) -> tensor<4xbf16>
    %3 = "stablehlo.convert"(%2) : (tensor<4xbf16>) -> tensor<4xf32>
    "func.return"(%1, %3) : (tensor<4xbf16>, tensor<4xf32>) -> ()
  }) : () -> ()
}) : () -> ()
