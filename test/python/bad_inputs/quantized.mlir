func.func @main(%x: tensor<4x8xf32>, %w: tensor<8x8x!quant.uniform<i8:f32, 0.1>>) -> tensor<4x8xf32> {
  %q = stablehlo.uniform_quantize %x : (tensor<4x8xf32>) -> tensor<4x8x!quant.uniform<i8:f32, 0.1>>
  %0 = stablehlo.dot_general %q, %w, contracting_dims = [1] x [0] : (tensor<4x8x!quant.uniform<i8:f32, 0.1>>, tensor<8x8x!quant.uniform<i8:f32, 0.1>>) -> tensor<4x8x!quant.uniform<i32:f32, 0.01>>
  %1 = stablehlo.uniform_dequantize %0 : (tensor<4x8x!quant.uniform<i32:f32, 0.01>>) -> tensor<4x8xf32>
  %2 = stablehlo.dot_general %1, %x, contracting_dims = [1] x [1] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  %3 = stablehlo.reshape %2 : (tensor<4x4xf32>) -> tensor<4x4xf32>
  return %1 : tensor<4x8xf32>
}
