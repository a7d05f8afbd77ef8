func.func @main(%a: f32) -> f32 {
  %0 = arith.addf %a, %a : f32
  return %0 : f32
}
