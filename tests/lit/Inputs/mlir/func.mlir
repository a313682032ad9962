// Custom-form func.func: the func dialect is not part of the bridge.
func.func @f() {
  return
}
