/* frontend/spec_fields.h — the table of every field an xmoec model JSON may
 * hold, and the table-driven reader built on it.
 *
 * One descriptor per field (section, key, kind, where it lives in xm_spec_t,
 * default, limits, allowed enum names, one line of meaning) drives the
 * defaults, the reading of JSON, the range checks and the unknown-key
 * suggestions, so adding a field is one table line plus its docs/spec.md
 * row (a unit test checks that every key is documented). The table is
 * static and read-only: descriptors are borrowed, never freed.
 */
#ifndef XM_FRONTEND_SPEC_FIELDS_H
#define XM_FRONTEND_SPEC_FIELDS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "frontend/spec.h"
#include "support/diag.h"

typedef enum {
  XM_SECTION_ROOT, /* top level of the model JSON */
  XM_SECTION_MODEL,
  XM_SECTION_MOE,
  XM_SECTION_TRAINING,
  XM_SECTION_CLUSTER, /* also the top level of a cluster file */
  XM_SECTION_PARALLEL,
  XM_SECTION_COUNT_
} xm_spec_section_t;

typedef enum {
  XM_FIELD_INT,            /* JSON integer; int64_t, int or uint64_t member */
  XM_FIELD_FLOAT,          /* JSON number; double member */
  XM_FIELD_BOOL,           /* JSON true/false; bool member */
  XM_FIELD_ENUM,           /* JSON string among enum_names; C enum member */
  XM_FIELD_STRING,         /* JSON string; char[XM_SPEC_NAME_MAX] member */
  XM_FIELD_NULLABLE_FLOAT, /* number or null; double + bool at flag_offset */
} xm_field_kind_t;

enum {
  XM_FIELD_REQUIRED = 1u << 0, /* must be given (in a present section) */
  XM_FIELD_MIN_EXCL = 1u << 1, /* value must be > min, not >= */
  XM_FIELD_MAX_EXCL = 1u << 2, /* value must be < max, not <= */
  XM_FIELD_DERIVED = 1u << 3,  /* default computed from other fields */
  XM_FIELD_NO_STORE = 1u << 4, /* accepted and type-checked, not stored */
};

typedef struct {
  xm_spec_section_t section;
  const char *key; /* JSON key == C member name */
  xm_field_kind_t kind;
  size_t offset;      /* of the member inside xm_spec_t */
  size_t size;        /* of the member (ints: 4 or 8 bytes) */
  size_t flag_offset; /* NULLABLE_FLOAT: its "has value" bool */
  double def;         /* default (bool 0/1, enum index) */
  double min, max;    /* INT/FLOAT/NULLABLE_FLOAT limits */
  unsigned flags;
  const char *const *enum_names; /* ENUM: NULL-terminated */
  const char *doc;               /* one line of meaning */
} xm_spec_field_t;

/* The fix for a value that is right but quoted ("; write the number
 * without quotes" for "4" where a number is meant, "; write true or false
 * without quotes" for "true" where a boolean is), "" otherwise: for the
 * type errors of specs and HF configs alike. */
const char *xm_spec_quoted_hint(const cJSON *v, bool want_bool);

int xm_spec_field_count(void);
/* Borrowed descriptor i, 0 <= i < xm_spec_field_count(). */
const xm_spec_field_t *xm_spec_field_get(int i);
/* Index of the field `key` in `section`, or -1. */
int xm_spec_field_find(xm_spec_section_t section, const char *key);
/* JSON key of a section ("model", ...; "" for the root). */
const char *xm_spec_section_name(xm_spec_section_t section);

/* Writes the table defaults into `spec` (derived fields get their table
 * fallback; frontend/spec.c computes the real derived values). */
void xm_spec_fields_set_defaults(xm_spec_t *spec);

/* Reads the object `obj` as `section`: type, integer, range and enum checks
 * per key, unknown and duplicate keys, missing required fields. Pointers are
 * `prefix` + "/" + key (prefix "" for a cluster file's top level). Valid
 * values are stored into `spec`; invalid ones leave the default. given[i] is
 * set for every table field i that the object holds. Returns the number of
 * errors it added. */
int xm_spec_fields_read(const cJSON *obj, xm_spec_section_t section, const char *prefix,
                        const char *source, xm_diag_t *diag, xm_spec_t *spec, bool *given);

/* Range check of the value field i holds in `spec` (after defaults were
 * derived, or after a Hugging Face import); reports at `pointer`. Returns
 * true when the value is within limits. */
bool xm_spec_field_check_stored(int i, const xm_spec_t *spec, const char *pointer,
                                const char *source, xm_diag_t *diag);

/* Appends a JSON pointer reference token for `key` (RFC 6901: '~' -> "~0",
 * '/' -> "~1") to `ptr` as "/key". */
void xm_json_pointer_append(char *ptr, size_t cap, const char *key);

#endif /* XM_FRONTEND_SPEC_FIELDS_H */
