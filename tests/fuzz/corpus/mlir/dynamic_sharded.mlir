"builtin.module"() <{sym_name = "dyn"}> ({
  %0 = "xmoe.input"() {name = "x", xmoe.shard = ["ep,_"]} : () -> tensor<?x64xbf16, [4096, 64]> loc(#loc1)
  %1 = "xmoe.input"() {name = "y", xmoe.shard = ["ep,tp"]} : () -> tensor<?x64xbf16, [4096, 64]> loc(#loc2)
  %2 = "xmoe.add"(%0, %1) {xmoe.shard = ["ep,_"]} : (tensor<?x64xbf16, [4096, 64]>, tensor<?x64xbf16, [4096, 64]>) -> tensor<?x64xbf16, [4096, 64]> loc(#loc)
  "xmoe.return"(%2) : (tensor<?x64xbf16, [4096, 64]>) -> () loc(#loc)
}) {xmoe.note = "sharded", xmoe.sizes = array<i64: 1, 2, 3>, xmoe.weights = array<f64: 5.000000e-01, 9.9999999999999995E-8>} : () -> () loc(#loc)
#loc = loc(unknown)
#loc1 = loc("/moe/top_k")
#loc2 = loc("model.json:/moe/top_k")
