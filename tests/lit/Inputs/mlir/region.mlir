// A region on an xmoe op.
module {
  "xmoe.add"() ({
    %0 = "xmoe.input"() : () -> tensor<4xf32>
  }) : () -> () loc("/model/layers")
}
