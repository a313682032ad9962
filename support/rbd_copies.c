/* support/rbd_copies.c — see rbd_copies.h. */
#include "support/rbd_copies.h"

double xm_rbd_expected_copies(int64_t experts, int64_t top_k, int64_t nodes) {
  if (nodes < 1 || experts < 1 || top_k < 1 || top_k > experts) return 0.0;
  /* C(E - m, k) / C(E, k) = prod_{i<k} (E - m - i) / (E - i): the chance
   * that no expert of a node holding m = E/nodes of them is chosen. */
  int64_t m = experts / nodes;
  double none = 1.0;
  for (int64_t i = 0; i < top_k; i++) {
    if (experts - m - i <= 0) {
      none = 0.0;
      break;
    }
    none *= (double)(experts - m - i) / (double)(experts - i);
  }
  return (double)nodes * (1.0 - none);
}
