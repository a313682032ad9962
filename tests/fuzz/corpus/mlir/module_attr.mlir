"builtin.module"() <{sym_name = "a"}> ({
  %0 = "xmoe.input"() {name = "x"} : () -> tensor<2x4xf32>
  "xmoe.return"(%0) : (tensor<2x4xf32>) -> ()
}) {foo.bar = 1 : i64, xmoe.flag = true, xmoe.list = array<i64: 1, 2>} : () -> ()
