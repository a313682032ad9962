// An unranked tensor result.
module {
  %0 = "xmoe.input"() {name = "tokens"} : () -> tensor<*xi32> loc("/training/seq_len")
}
