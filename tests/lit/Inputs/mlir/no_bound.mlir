// A dynamic dim needs its upper bound in the tensor encoding.
module {
  %0 = "xmoe.input"() {name = "rows"} : () -> tensor<?x4xf32> loc("/moe/capacity_factor")
}
