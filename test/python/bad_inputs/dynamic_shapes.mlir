func.func @main(%w: tensor<8x8xf32>, %x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<?x8xf32>, tensor<8x8xf32>) -> tensor<?x8xf32>
  %1 = stablehlo.tanh %0 : tensor<?x8xf32>
  return %1 : tensor<?x8xf32>
}
