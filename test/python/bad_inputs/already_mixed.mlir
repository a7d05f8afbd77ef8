func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %xb = stablehlo.convert %x : (tensor<4x8xf32>) -> tensor<4x8xbf16>
  %wb = stablehlo.convert %w : (tensor<8x8xf32>) -> tensor<8x8xbf16>
  %0 = stablehlo.dot_general %xb, %wb, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x8xbf16>) -> tensor<4x8xbf16>
  %1 = stablehlo.tanh %0 : tensor<4x8xbf16>
  %2 = stablehlo.convert %1 : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  return %2 : tensor<4x8xf32>
}
