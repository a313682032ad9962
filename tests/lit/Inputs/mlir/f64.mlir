// f64 is not an IR dtype.
module {
  %0 = "xmoe.param"() {name = "w"} : () -> tensor<4x4xf64> loc("/model/hidden")
}
