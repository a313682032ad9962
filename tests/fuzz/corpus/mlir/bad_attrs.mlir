"builtin.module"() <{sym_name = "a"}> ({
  %0 = "xmoe.input"() {name = 3 : i32, xmoe.shard = ["ep,_", "tp"]} : () -> tensor<?x64xbf16, [4096]>
  %1 = "xmoe.scale"(%0, %0) {alpha = dense<[1.0, 2.0]> : tensor<2xf32>, beta = unit} : (tensor<?x64xbf16, [4096]>, tensor<?x64xbf16, [4096]>) -> tensor<?x64xbf16, [4096]>
  "xmoe.return"(%1) : (tensor<?x64xbf16, [4096]>) -> ()
}) {xmoe.ok = 1 : i64} : () -> ()
