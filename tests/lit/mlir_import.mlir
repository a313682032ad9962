// Hand-written MLIR imports into IR: bounds of dynamic dims come from the
// tensor encoding, sharding from xmoe.shard, locations from name locations
// (escapes undone), module attributes from the xmoe. prefix; file locations
// and unknown locations become "".
// RUN: %xmoec opt %s --pipeline= | FileCheck %s

// CHECK: module @hand attributes {mesh = [2, 4], note = "a \"b\"", ssmb = true} {
// CHECK-NEXT: %0 = input() {name = "tokens"} : i32[2, 8]{{$}}
// CHECK-NEXT: %1 = narrow(%0) {dim = 1, group = "tp", group_size = 2} : i32[2, 4/tp] loc("/parallel/\"tp\"\\x")
// CHECK-NEXT: %2 = param() {init = "zeros", name = "w", scales = [0.5, 1e-06], trainable = false} : bf16[?16/ep, 4] loc("/moe/experts")
// CHECK-NEXT: %3 = constant() {value = 0.0} : f32[]{{$}}
// CHECK-NEXT: return(%3, %1, %2){{$}}
// CHECK-NEXT: }
module @hand attributes {xmoe.mesh = array<i64: 2, 4>, xmoe.note = "a \"b\"", xmoe.ssmb = true} {
  %0 = "xmoe.input"() {name = "tokens"} : () -> tensor<2x8xi32>
  %1 = "xmoe.narrow"(%0) {dim = 1, group = "tp", group_size = 2, xmoe.shard = ["_,tp"]} : (tensor<2x8xi32>) -> tensor<2x4xi32> loc("/parallel/\"tp\"\\x")
  %2 = "xmoe.param"() {init = "zeros", name = "w", scales = array<f64: 0.5, 1.0e-6>, trainable = false, xmoe.shard = ["ep,_"]} : () -> tensor<?x4xbf16, [16, 4]> loc("/moe/experts")
  %3 = "xmoe.constant"() {value = 0.0} : () -> tensor<f32>
  "xmoe.return"(%3, %1, %2) : (tensor<f32>, tensor<2x4xi32>, tensor<?x4xbf16, [16, 4]>) -> () loc(unknown)
}
