"builtin.module"() <{sym_name = "mini"}> ({
  %0 = "xmoe.input"() {name = "tokens"} : () -> tensor<1x4xi32> loc(#loc1)
  %1 = "xmoe.input"() {name = "labels"} : () -> tensor<1x4xi32> loc(#loc1)
  %2 = "xmoe.param"() {init = "normal", name = "model.embed_tokens.weight", role = "replicated", std = 2.000000e-02 : f64} : () -> tensor<16x8xf32> loc(#loc2)
  %3 = "xmoe.embedding"(%0, %2) : (tensor<1x4xi32>, tensor<16x8xf32>) -> tensor<1x4x8xf32> loc(#loc2)
  %4 = "xmoe.param"() {init = "ones", layer = 0 : i64, name = "model.layers.0.input_layernorm.weight", role = "replicated"} : () -> tensor<8xf32> loc(#loc3)
  %5 = "xmoe.rmsnorm"(%3, %4) {eps = 9.9999999999999995E-7 : f64, layer = 0 : i64} : (te