// amp-round-state{optimizer-state=f8} alone: each f32 argument marked
// amp.optimizer_state of N elements becomes blocks of 260 bytes: per block
// of 256 elements, the FP8 E4M3 codes of r = sign(x) * sqrt(|x|) (scaled so
// the block's largest |r| is 448; a nonzero r at least E4M3's smallest
// code, 2^-9) and the block's f32 scale as 4 bytes. It is decoded to f32
// where it is read and its new value encoded before the return. The blocks
// keep as many of the tensor's leading dimensions as hold whole blocks
// (d0 x ... x dk x B x 260, so the state shards like the tensor along
// them); where none do, the tensor is flattened and zero-padded
// (ceil(N/256) x 260).
//
// RUN: amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=f8})' | FileCheck %s
// RUN: not amp-opt %s --split-input-file --pass-pipeline='builtin.module(amp-round-state{optimizer-state=f4})' 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: error: invalid option 'optimizer-state': unknown optimizer-state dtype 'f4' (accepted: f32, bf16, f8)

// 600 elements: 3 blocks, the last zero-padded; 512: 2 blocks, returned
// unchanged as the argument itself; the unmarked f32 argument is left alone.
// CHECK-LABEL: func.func public @main(
// CHECK-SAME: %arg0: tensor<4xf32>, %[[M:arg1]]: tensor<3x260xui8>, %[[G:arg2]]: tensor<2x300xf32>, %[[H:arg3]]: tensor<2x260xui8>)
// CHECK-SAME: -> (tensor<3x260xui8> {amp.state_of = 1 : i64}, tensor<2x260xui8> {amp.state_of = 3 : i64})
// CHECK-NOT: amp.optimizer_state
// Decoding: codes times the block's scale, the padding cut off.
// CHECK: %[[CODEB:.*]] = stablehlo.slice %[[M]] [0:3, 0:256] : (tensor<3x260xui8>) -> tensor<3x256xui8>
// CHECK: %[[CODES:.*]] = stablehlo.bitcast_convert %[[CODEB]] : (tensor<3x256xui8>) -> tensor<3x256xf8E4M3FN>
// CHECK: %[[SCALEB:.*]] = stablehlo.slice %[[M]] [0:3, 256:260] : (tensor<3x260xui8>) -> tensor<3x4xui8>
// CHECK: %[[SCALE:.*]] = stablehlo.bitcast_convert %[[SCALEB]] : (tensor<3x4xui8>) -> tensor<3xf32>
// CHECK: %[[WIDE:.*]] = stablehlo.convert %[[CODES]] : (tensor<3x256xf8E4M3FN>) -> tensor<3x256xf32>
// CHECK: %[[SCALES:.*]] = stablehlo.broadcast_in_dim %[[SCALE]], dims = [0] : (tensor<3xf32>) -> tensor<3x256xf32>
// CHECK: %[[ROOTS:.*]] = stablehlo.multiply %[[WIDE]], %[[SCALES]] : tensor<3x256xf32>
// CHECK: %[[MAGNITUDES:.*]] = stablehlo.abs %[[ROOTS]] : tensor<3x256xf32>
// CHECK: %[[VALUES:.*]] = stablehlo.multiply %[[ROOTS]], %[[MAGNITUDES]] : tensor<3x256xf32>
// CHECK: %[[FLAT:.*]] = stablehlo.reshape %[[VALUES]] : (tensor<3x256xf32>) -> tensor<768xf32>
// CHECK: %[[CUT:.*]] = stablehlo.slice %[[FLAT]] [0:600] : (tensor<768xf32>) -> tensor<600xf32>
// CHECK: %[[READ:.*]] = stablehlo.reshape %[[CUT]] : (tensor<600xf32>) -> tensor<2x300xf32>
// CHECK: %[[NEW:.*]] = stablehlo.multiply %[[READ]], %[[G]] : tensor<2x300xf32>
// Encoding: companded, zero-padded blocks, largest magnitude per block,
// scale = largest / 448 (1 for an all-zero block, so nothing divides by
// zero), magnitudes lifted to 2^-9 and clamped to E4M3's range, then the
// scale's bytes after the codes.
// CHECK: %[[SIGN:.*]] = stablehlo.sign %[[NEW]] : tensor<2x300xf32>
// CHECK: %[[NABS:.*]] = stablehlo.abs %[[NEW]] : tensor<2x300xf32>
// CHECK: %[[ROOT:.*]] = stablehlo.sqrt %[[NABS]] : tensor<2x300xf32>
// CHECK: %[[R:.*]] = stablehlo.multiply %[[SIGN]], %[[ROOT]] : tensor<2x300xf32>
// CHECK: %[[NFLAT:.*]] = stablehlo.reshape %[[R]] : (tensor<2x300xf32>) -> tensor<600xf32>
// CHECK: %[[PAD:.*]] = stablehlo.concatenate %[[NFLAT]], %{{.*}}, dim = 0 : (tensor<600xf32>, tensor<168xf32>) -> tensor<768xf32>
// CHECK: %[[BLOCKS:.*]] = stablehlo.reshape %[[PAD]] : (tensor<768xf32>) -> tensor<3x256xf32>
// CHECK: %[[ABS:.*]] = stablehlo.abs %[[BLOCKS]]
// CHECK: %[[LARGEST:.*]] = stablehlo.reduce(%[[ABS]] init: %{{.*}}) applies stablehlo.maximum across dimensions = [1] : (tensor<3x256xf32>, tensor<f32>) -> tensor<3xf32>
// CHECK: %[[NEWSCALE:.*]] = stablehlo.divide %[[LARGEST]], %{{.*}} : tensor<3xf32>
// CHECK: %[[POSITIVE:.*]] = stablehlo.compare GT, %[[LARGEST]]
// CHECK: %[[DIVISOR:.*]] = stablehlo.select %[[POSITIVE]], %[[NEWSCALE]], %{{.*}} : tensor<3xi1>, tensor<3xf32>
// CHECK: %[[DIVISORS:.*]] = stablehlo.broadcast_in_dim %[[DIVISOR]], dims = [0]
// CHECK: %[[SCALED:.*]] = stablehlo.divide %[[BLOCKS]], %[[DIVISORS]] : tensor<3x256xf32>
// CHECK: %[[SSIGN:.*]] = stablehlo.sign %[[SCALED]]
// CHECK: %[[SABS:.*]] = stablehlo.abs %[[SCALED]]
// CHECK: %[[SMALLEST:.*]] = stablehlo.constant dense<0.001953125> : tensor<f32>
// CHECK: %[[SMALLESTS:.*]] = stablehlo.broadcast_in_dim %[[SMALLEST]]
// CHECK: %[[LIFTED:.*]] = stablehlo.maximum %[[SABS]], %[[SMALLESTS]]
// CHECK: %[[SIGNED:.*]] = stablehlo.multiply %[[SSIGN]], %[[LIFTED]]
// CHECK: %[[CLAMPED:.*]] = stablehlo.clamp %{{.*}}, %[[SIGNED]], %{{.*}} : tensor<3x256xf32>
// CHECK: %[[NEWCODES:.*]] = stablehlo.convert %[[CLAMPED]] : (tensor<3x256xf32>) -> tensor<3x256xf8E4M3FN>
// CHECK: %[[NEWCODEB:.*]] = stablehlo.bitcast_convert %[[NEWCODES]] : (tensor<3x256xf8E4M3FN>) -> tensor<3x256xui8>
// CHECK: %[[NEWSCALEB:.*]] = stablehlo.bitcast_convert %[[NEWSCALE]] : (tensor<3xf32>) -> tensor<3x4xui8>
// CHECK: %[[STORED:.*]] = stablehlo.concatenate %[[NEWCODEB]], %[[NEWSCALEB]], dim = 1 : (tensor<3x256xui8>, tensor<3x4xui8>) -> tensor<3x260xui8>
// CHECK: return %[[STORED]], %[[H]] : tensor<3x260xui8>, tensor<2x260xui8>
func.func public @main(%w: tensor<4xf32>, %m: tensor<2x300xf32> {amp.optimizer_state}, %g: tensor<2x300xf32>, %h: tensor<512xf32> {amp.optimizer_state}) -> (tensor<2x300xf32> {amp.state_of = 1 : i64}, tensor<512xf32> {amp.state_of = 3 : i64}) {
  %0 = stablehlo.multiply %m, %g : tensor<2x300xf32>
  return %0, %h : tensor<2x300xf32>, tensor<512xf32>
}

// -----

// Leading dimensions kept: 8x512 holds 2 blocks per row (8x2x260), a
// 3x3x64x128 kernel 32 blocks per 3x3 position (3x3x32x260); every op
// works along the last dimensions, and nothing is padded or sliced.
// CHECK-LABEL: func.func public @main(
// CHECK-SAME: %[[M:arg0]]: tensor<8x2x260xui8>{{.*}}%[[K:arg2]]: tensor<3x3x32x260xui8>
// CHECK-SAME: -> (tensor<8x2x260xui8> {amp.state_of = 0 : i64}, tensor<3x3x32x260xui8> {amp.state_of = 2 : i64})
// Each argument is decoded where the block starts, the last one first.
// CHECK: stablehlo.slice %[[K]] [0:3, 0:3, 0:32, 0:256] : (tensor<3x3x32x260xui8>) -> tensor<3x3x32x256xui8>
// CHECK: stablehlo.reshape %{{.*}} : (tensor<3x3x32x256xf32>) -> tensor<3x3x64x128xf32>
// CHECK: %[[CODEB:.*]] = stablehlo.slice %[[M]] [0:8, 0:2, 0:256] : (tensor<8x2x260xui8>) -> tensor<8x2x256xui8>
// CHECK: %[[SCALEB:.*]] = stablehlo.slice %[[M]] [0:8, 0:2, 256:260] : (tensor<8x2x260xui8>) -> tensor<8x2x4xui8>
// CHECK: %[[SCALE:.*]] = stablehlo.bitcast_convert %[[SCALEB]] : (tensor<8x2x4xui8>) -> tensor<8x2xf32>
// CHECK: stablehlo.broadcast_in_dim %[[SCALE]], dims = [0, 1] : (tensor<8x2xf32>) -> tensor<8x2x256xf32>
// CHECK-NOT: stablehlo.slice {{.*}}xf32>
// CHECK: stablehlo.reshape %{{.*}} : (tensor<8x2x256xf32>) -> tensor<8x512xf32>
// CHECK: stablehlo.reshape %{{.*}} : (tensor<8x512xf32>) -> tensor<8x2x256xf32>
// CHECK: stablehlo.reduce(%{{.*}} init: %{{.*}}) applies stablehlo.maximum across dimensions = [2] : (tensor<8x2x256xf32>, tensor<f32>) -> tensor<8x2xf32>
// CHECK: %[[NEWSCALEB:.*]] = stablehlo.bitcast_convert %{{.*}} : (tensor<8x2xf32>) -> tensor<8x2x4xui8>
// CHECK: stablehlo.concatenate %{{.*}}, %[[NEWSCALEB]], dim = 2 : (tensor<8x2x256xui8>, tensor<8x2x4xui8>) -> tensor<8x2x260xui8>
// CHECK: stablehlo.reshape %{{.*}} : (tensor<3x3x64x128xf32>) -> tensor<3x3x32x256xf32>
// CHECK: stablehlo.concatenate %{{.*}}, %{{.*}}, dim = 3 : (tensor<3x3x32x256xui8>, tensor<3x3x32x4xui8>) -> tensor<3x3x32x260xui8>
func.func public @main(%m: tensor<8x512xf32> {amp.optimizer_state}, %g: tensor<8x512xf32>, %k: tensor<3x3x64x128xf32> {amp.optimizer_state}, %gk: tensor<3x3x64x128xf32>) -> (tensor<8x512xf32> {amp.state_of = 0 : i64}, tensor<3x3x64x128xf32> {amp.state_of = 2 : i64}) {
  %0 = stablehlo.multiply %m, %g : tensor<8x512xf32>
  %1 = stablehlo.multiply %k, %gk : tensor<3x3x64x128xf32>
  return %0, %1 : tensor<8x512xf32>, tensor<3x3x64x128xf32>
}
