/* fabric/price.h — what a network costs: a price per item of a topology's
 * bill of materials (fabric/topology.h, xm_fab_bom_t).
 *
 * The built-in table (docs/fabric-prices.md gives every number's source or
 * says how it was estimated) prices, in US dollars per item:
 *
 *   by link speed (100, 200, 400, 800 Gb/s): a server NIC port, an
 *     optical transceiver, an electrical switch port (its share of the
 *     switch box), a direct-attach copper cable;
 *   whatever the speed: an optical circuit-switch port (an OCS switches
 *     light, so one port serves every line rate), an optical fibre, and a
 *     chassis price per electrical and per optical switch (0 in the
 *     built-in table: the port prices include the box).
 *
 * A speed between two rows of the table is priced by interpolating each
 * per-speed item as a power law between its two neighbours (linear in
 * log price against log speed), which keeps the cost per Gb/s of the rows
 * and is exact at the rows; a speed outside the table's range is refused,
 * since no trend outside the measured rows is trustworthy; a price file can
 * add the row.
 *
 * A price file (JSON, format in docs/fabric-prices.md) replaces entries of
 * a table or adds speeds:
 *
 *   {"prices": {"400": {"nic_port": 1500, "transceiver": 650},
 *               "1600": {"nic_port": 4000, "transceiver": 2400,
 *                        "switch_port": 6000, "copper_cable": 400},
 *               "ocs_port": 450, "fibre": 30}}
 *
 * Ownership: xm_fab_prices_t is a plain value (no pointers); copy freely.
 */
#ifndef XM_FABRIC_PRICE_H
#define XM_FABRIC_PRICE_H

#include <stdbool.h>
#include <stddef.h>

#include "fabric/topology.h"
#include "support/diag.h"
#include "support/status.h"

#define XM_FAB_PRICE_SPEEDS_MAX 16 /* rows of a table */

/* The prices that depend on the link speed, per item, for one speed. */
typedef struct {
  double gbps;         /* Gb/s per port */
  double nic_port;     /* one server NIC port */
  double transceiver;  /* one optical transceiver (one end of a link) */
  double switch_port;  /* one electrical packet-switch port */
  double copper_cable; /* one direct-attach copper cable */
} xm_fab_speed_price_t;

typedef struct {
  xm_fab_speed_price_t speeds[XM_FAB_PRICE_SPEEDS_MAX]; /* gbps ascending */
  int num_speeds;
  double ocs_port;       /* one optical circuit-switch port */
  double fibre;          /* one optical fibre (cable) */
  double switch_chassis; /* one electrical switch, beyond its ports */
  double ocs_chassis;    /* one optical circuit switch, beyond its ports */
} xm_fab_prices_t;

/* What a bill of materials costs, by category (dollars); total is the sum. */
typedef struct {
  double nic_ports, transceivers, switch_ports, switches, ocs_ports, ocs_switches, fibres,
      copper_cables;
  double total;
} xm_fab_price_breakdown_t;

/* The built-in table (docs/fabric-prices.md). */
void xm_fab_prices_default(xm_fab_prices_t *out);

/* Applies a price file to *p (start from xm_fab_prices_default): every
 * entry it names replaces the table's, a speed the table lacks is added
 * (then it must give all four per-speed items). Nothing is changed unless
 * the whole file is valid. Errors name the file and the place (a JSON
 * pointer, or line:column for a syntax error): XM_ERR_IO when the file
 * cannot be read, XM_ERR_INVALID_INPUT for anything else (unknown keys,
 * a value that is not a finite number >= 0, a speed key that is not a
 * positive number, a table over XM_FAB_PRICE_SPEEDS_MAX rows). */
xm_status_t xm_fab_prices_load_file(const char *path, xm_fab_prices_t *p, xm_diag_t *diag);
/* The same from text in memory; `source` names it in messages. */
xm_status_t xm_fab_prices_load_text(const char *text, size_t len, const char *source,
                                    xm_fab_prices_t *p, xm_diag_t *diag);

/* The per-speed prices at `gbps`: a row's own prices, or the power-law
 * interpolation between its neighbours. False when gbps is not finite and
 * positive or lies outside the table's rows. */
bool xm_fab_prices_at(const xm_fab_prices_t *p, double gbps, xm_fab_speed_price_t *out);

/* xm_fab_prices_at, with a refusal reported to `diag` as an error at
 * `place` (a flag or key such as "--link-gbps"; may be NULL):
 * XM_ERR_INVALID_INPUT. */
xm_status_t xm_fab_prices_check_speed(const xm_fab_prices_t *p, double gbps, const char *place,
                                      xm_diag_t *diag);

/* The price of `bom` (its link_gbps selects the per-speed prices) with the
 * breakdown by category in *out (may be NULL). Returns the total, or NaN
 * (and a breakdown of NaNs) when the speed is outside the table: check it
 * first with xm_fab_prices_check_speed. */
double xm_fab_price(const xm_fab_bom_t *bom, const xm_fab_prices_t *p,
                    xm_fab_price_breakdown_t *out);

#endif /* XM_FABRIC_PRICE_H */
