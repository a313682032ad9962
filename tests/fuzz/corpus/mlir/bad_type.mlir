"builtin.module"() <{sym_name = "bad"}> ({
  %0 = "xmoe.input"() {name = "x"} : () -> memref<4x8xf32>
  %1 = "xmoe.input"() {name = "y"} : () -> tensor<4x8xcomplex<f32>>
  "xmoe.return"(%0) : (memref<4x8xf32>) -> ()
}) : () -> ()
