// The type is never closed.
module {
  %0 = "xmoe.input"() {name = "tokens"} : () -> tensor<2x8xi32
}
