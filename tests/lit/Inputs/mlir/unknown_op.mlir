// A generic-form module whose op is not in the xmoe dialect.
"builtin.module"() ({
  %0 = "xmoe.input"() {name = "tokens"} : () -> tensor<2x8xi32> loc("/training/seq_len")
  %1 = "xmoe.frobnicate"(%0) : (tensor<2x8xi32>) -> tensor<2x8xi32> loc("/model/frob")
}) : () -> ()
