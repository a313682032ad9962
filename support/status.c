/* support/status.c — names and exit codes of status classes. */
#include "support/status.h"

const char *xm_status_name(xm_status_t s) {
  switch (s) {
  case XM_OK: return "ok";
  case XM_ERR_INVALID_INPUT: return "invalid input";
  case XM_ERR_IO: return "i/o error";
  case XM_ERR_UNSUPPORTED: return "unsupported";
  case XM_ERR_NO_MEMORY: return "out of memory";
  case XM_ERR_INTERNAL: return "internal error";
  }
  return "unknown status";
}

int xm_status_exit_code(xm_status_t s) {
  switch (s) {
  case XM_OK: return 0;
  case XM_ERR_INVALID_INPUT:
  case XM_ERR_IO:
  case XM_ERR_UNSUPPORTED: return 2;
  default: return 1;
  }
}
