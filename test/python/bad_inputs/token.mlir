func.func @main(%t: !stablehlo.token, %x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> (!stablehlo.token, tensor<4x8xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %1 = stablehlo.custom_call @log_it(%t, %0) {has_side_effect = true} : (!stablehlo.token, tensor<4x8xf32>) -> !stablehlo.token
  return %1, %0 : !stablehlo.token, tensor<4x8xf32>
}
