"""Where tokens sit in packed rows: span mean-pooling, segment starts and BERT pair token types.

The local scorer pools every span (the query's tokens of one sequence, or one sentence's tokens)
exactly, with a segment sum over the flattened tokens (`pool_spans`), and derives BERT's
sentence-pair token types from the span table (`pair_token_types`), so the packed batch is the
same for every encoder family (`local_scorer`'s module doc).
"""

import jax
import jax.numpy as jnp

from logrerank_jax.schema import SPAN_SENTENCE


def pool_spans(hidden, span_ids, num_spans: int):
  """Mean-pool token states per span over a packed batch.

  Args:
    hidden: [R, L, d] token states (any float dtype).
    span_ids: [R, L] int32, 0 = token not pooled, else a span index in [1, num_spans).
    num_spans: S, the span-table length (static).

  Returns:
    (pooled [S, d] float32, counts [S] float32); spans without tokens (and span 0) are zero.
  """
  d = hidden.shape[-1]
  flat_h = hidden.reshape(-1, d).astype(jnp.float32)  # [R*L, d]
  flat_s = span_ids.reshape(-1).astype(jnp.int32)  # [R*L]
  # Span 0 collects CLS/SEP/padding; weight them out so pooled[0] is a clean zero.
  w = (flat_s > 0).astype(jnp.float32)  # [R*L]
  sums = jax.ops.segment_sum(flat_h * w[:, None], flat_s, num_segments=num_spans)  # [S, d]
  counts = jax.ops.segment_sum(w, flat_s, num_segments=num_spans)  # [S]
  pooled = sums / jnp.maximum(counts, 1.0)[:, None]
  return pooled, counts


def segment_starts(segment_ids):
  """(index of each token in its row, index of its segment's first token), both [R, L] int32;
  a segment is a contiguous run of one `segment_ids` value."""
  pos = jnp.broadcast_to(jnp.arange(segment_ids.shape[1], dtype=jnp.int32), segment_ids.shape)
  boundary = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
  return pos, jax.lax.cummax(jnp.where(boundary, pos, 0), axis=1)


def pair_token_types(span_ids, span_kind, segment_ids):
  """BERT sentence-pair token types of packed rows, derived from the span table.

  In each packed sequence `[CLS] q [SEP] s_1 ... s_m [SEP]`, a token is type 1 when it is a
  sentence token or follows one within its segment (so the sentences and the final [SEP]),
  else 0 (`[CLS]`, the query, its [SEP]; padding). Segments are contiguous runs of one
  `segment_ids` value, as the packer lays them out.

  Args:
    span_ids: [R, L] int32 span of each token (0 = not pooled).
    span_kind: [S] int32 kind of each span.
    segment_ids: [R, L] int32, 0 = padding.

  Returns:
    [R, L] int32 token types in {0, 1}.
  """
  is_sent = (jnp.take(span_kind, span_ids, mode="clip") == SPAN_SENTENCE).astype(jnp.int32)
  seen = jnp.cumsum(is_sent, axis=1)  # sentence tokens at or before each position  [R, L]
  _, start = segment_starts(segment_ids)
  before = jnp.take_along_axis(seen - is_sent, start, axis=1)  # sentence tokens before it
  return ((seen - before > 0) & (segment_ids > 0)).astype(jnp.int32)
