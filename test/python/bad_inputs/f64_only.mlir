func.func @main(%x: tensor<4x8xf64>, %w: tensor<8x8xf64>) -> tensor<4x8xf64> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf64>, tensor<8x8xf64>) -> tensor<4x8xf64>
  %1 = stablehlo.exponential %0 : tensor<4x8xf64>
  return %1 : tensor<4x8xf64>
}
