/* runtime/io/data.h — training data: token streams from files.
 *
 * Three formats, detected by content: a token file (a 16-byte header
 * "XMTOKENS" magic, u32 version 1, u32 bytes per token (2 or 4), then
 * little-endian token ids), the Megatron indexed dataset (PATH.bin + PATH.idx,
 * given as PATH, PATH.bin or PATH.idx; all documents concatenated), and
 * anything else as raw text through the byte-level tokenizer (token = byte,
 * vocab 256; the file must be UTF-8 text, see runtime/io/data.c). A stream is one sequence of tokens; sequence j of a split is
 * tokens[j*S : j*S + S + 1] (inputs the first S, labels the last S), so
 * windows are deterministic (docs/design.md, Interfaces). The last `eval_fraction` of the
 * windows (at least one) form the evaluation split; training reads only the
 * ones before. Every problem (unreadable file, bad header, truncated index,
 * token id >= vocab, too few tokens for one window) is reported with the
 * path and byte offset, status XM_ERR_INVALID_INPUT or XM_ERR_IO.
 */
#ifndef XM_RUNTIME_DATA_H
#define XM_RUNTIME_DATA_H

#include <stdint.h>

#include "support/diag.h"
#include "support/status.h"

typedef struct xm_rt_data xm_rt_data_t;

typedef enum { XM_RT_DATA_TEXT, XM_RT_DATA_TOKENS, XM_RT_DATA_MEGATRON } xm_rt_data_format_t;

/* Opens a data set for windows of seq_len (+1) tokens with ids < vocab.
 * The caller owns *out (xm_rt_data_close). */
xm_status_t xm_rt_data_open(const char *path, int64_t vocab, int64_t seq_len,
                            double eval_fraction, xm_diag_t *diag, xm_rt_data_t **out);
void xm_rt_data_close(xm_rt_data_t *d);

xm_rt_data_format_t xm_rt_data_format(const xm_rt_data_t *d);
int64_t xm_rt_data_num_tokens(const xm_rt_data_t *d);
int64_t xm_rt_data_train_windows(const xm_rt_data_t *d);
int64_t xm_rt_data_eval_windows(const xm_rt_data_t *d);

/* Copies window j of the split (train: 0 <= j < train_windows, eval likewise)
 * into tokens[S] and labels[S]. Fails (XM_ERR_IO, a message in diag) when a
 * file of the data set changed since it was opened or an id it copies is
 * outside the vocabulary; every id written is in [0, vocab). */
xm_status_t xm_rt_data_window(const xm_rt_data_t *d, int eval, int64_t j, int32_t *tokens,
                              int32_t *labels, xm_diag_t *diag);

/* Writes a token file (format above) — used by tests and tools. */
xm_status_t xm_rt_data_write_tokens(const char *path, const uint32_t *tokens, int64_t n,
                                    int bytes_per_token, xm_diag_t *diag);

#endif /* XM_RUNTIME_DATA_H */
