// amp-opt reads a portable artifact (jax.export's mlir_module_serialized:
// VHLO bytecode), rewrites it, and writes a portable artifact for the same
// StableHLO version back (or the form --emit asks for).
//
// RUN: python -c "import jax, jax.numpy as jnp; from jax import export; e = export.export(jax.jit(lambda w, x: jnp.tanh(x @ w)))(jnp.ones((8, 8)), jnp.ones((4, 8))); open('%t.vhlo', 'wb').write(e.mlir_module_serialized)"
// RUN: amp-opt %t.vhlo --target gpu --dot-result f32 --report -o %t.out.vhlo 2>&1 | FileCheck %s --check-prefix=REPORT
// RUN: python -c "import sys; d = open('%t.vhlo', 'rb').read(); o = open('%t.out.vhlo', 'rb').read(); assert o.startswith(b'ML\xefR'), o[:16]; v = d[5:d.index(b'\0', 5)]; assert o[5:o.index(b'\0', 5)] == v, (o[:32], v); print('portable', v.decode())" | FileCheck %s --check-prefix=FORM
// RUN: amp-opt %t.out.vhlo --pass-pipeline='builtin.module()' --emit pretty | FileCheck %s
// RUN: amp-opt %t.vhlo --target gpu --dot-result f32 --emit pretty | FileCheck %s

// REPORT: lowered to bf16: 1 op (dot_general 1)
// FORM: portable StableHLO_v{{[0-9]+\.[0-9]+\.[0-9]+}}
// CHECK: stablehlo.dot_general {{.*}} : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xf32>
// CHECK: stablehlo.tanh
