"""The dense prior of the local logit (NOT in the paper; `LocalScorerConfig.dense_prior` > 0).

The local logit gains w * cos(q, s), w the learned scalar `dense_prior_scale` (`local_scorer`'s
module doc, "Dense prior"). With the "split" encoding q and s come from a second pass of the
same encoder over the rows laid out by `split_query_passage` (query and passage as separate
attention segments, the bi-encoder layout), pooled per sentence or, with passage pooling, over
each segment (`segment_means`); `dense_prior_term` forms the term itself.
"""

import jax
import jax.numpy as jnp

from logrerank_jax.models.spans import pair_token_types, segment_starts


def segment_means(hidden, segment_ids):
  """Every token's mean of the token states of its attention segment.

  Args:
    hidden: [R, L, d] token states (any float dtype).
    segment_ids: [R, L] int32, contiguous runs of one value (0 = padding).

  Returns:
    [R, L, d] float32; padding tokens hold zeros.
  """
  r, l, d = hidden.shape
  _, start = segment_starts(segment_ids)
  # One sum per (row, first token of the segment): exact sums, no cumulative rounding.
  key = (jnp.arange(r, dtype=jnp.int32)[:, None] * l + start).reshape(-1)  # [R*L]
  w = (segment_ids > 0).reshape(-1).astype(jnp.float32)  # [R*L]
  flat = hidden.reshape(-1, d).astype(jnp.float32) * w[:, None]
  sums = jax.ops.segment_sum(flat, key, num_segments=r * l)  # [R*L, d]
  counts = jax.ops.segment_sum(w, key, num_segments=r * l)  # [R*L]
  means = jnp.take(sums, key, axis=0) / jnp.maximum(jnp.take(counts, key), 1.0)[:, None]
  return (means * w[:, None]).reshape(r, l, d)


def split_query_passage(input_ids, span_ids, span_kind, segment_ids, position_ids,
                        passage_cls: bool = True):
  """Token ids, segments and positions that encode each packed sequence as a bi-encoder would.

  Every sequence `[CLS] q [SEP] s_1 ... s_m [SEP]` becomes two attention segments, so the
  query's states are those of the query encoded alone and the passage's those of the passage
  alone; the sentence spans keep their tokens, so `pool_spans` pools them as before.

  * `passage_cls=True`: `[CLS] q` (positions unchanged, 0 ...) and `[CLS] s_1 ... s_m [SEP]`,
    whose `[CLS]` is the query's closing `[SEP]` slot with the sequence's first token id put in
    it, at position 0: the passage exactly as the bi-encoder encodes it. The row has one slot
    between the two sides, and the passage needs it more: all-MiniLM-L6-v2's ranking of the
    ScholarQA-CS pools is 78.7 nDCG@10 without the passage's [CLS] and 82.5 with it and
    without the query's [SEP] (82.2 with both; docs/DEMO.md, probe "CLS").
  * `passage_cls=False` (models trained before the option): `[CLS] q [SEP]` and
    `s_1 ... s_m [SEP]` (positions restarted at 1, the slot after an absent `[CLS]`).

  Args:
    input_ids, span_ids, segment_ids, position_ids: [R, L] int32 (contract C5).
    span_kind: [S] int32.
    passage_cls: the layout above.

  Returns:
    (input_ids, segment_ids, position_ids), each [R, L] int32; padding keeps segment 0.
  """
  part = pair_token_types(span_ids, span_kind, segment_ids)  # 0 query side, 1 passage side
  if passage_cls:
    # The query side's last token is the one just before a passage-side token (the passage
    # side never opens a segment: a segment starts with [CLS], query side).
    after = jnp.concatenate([part[:, 1:], jnp.zeros_like(part[:, :1])], axis=1)
    opener = (part == 0) & (after == 1) & (segment_ids > 0)
    _, first = segment_starts(segment_ids)
    input_ids = jnp.where(opener, jnp.take_along_axis(input_ids, first, axis=1), input_ids)
    part = part | opener.astype(part.dtype)
  seg = jnp.where(segment_ids > 0, 2 * segment_ids + part, 0)
  pos, start = segment_starts(seg)
  offset = 0 if passage_cls else 1
  return (input_ids, seg,
          jnp.where(part > 0, pos - start + offset, position_ids).astype(jnp.int32))


def dense_prior_term(module, cfg, prior_pass, split_rows, prior_pooled, q_idx, h_q, h_s):
  """w * cos(q, s) for every span [S] (float32): the prior's term of the local logit.

  Args:
    module: the `LocalScorer` being applied (compact); it holds w, param `dense_prior_scale` [1].
    cfg: its `LocalScorerConfig` (`dense_prior` > 0).
    prior_pass: (ids, segments, positions) -> the split pass's pooled spans [S, d].
    split_rows: () -> the rows in the split layout (`split_query_passage`); called only when
      the pass runs here.
    prior_pooled: the split pass's pooled spans computed elsewhere, or None (`LocalScorer`).
    q_idx: [S] int32 query span of each span.
    h_q, h_s: [S, d] pooled query and span states of the joint sequence.
  """
  scale = module.param("dense_prior_scale",
                       lambda _, shape: jnp.full(shape, cfg.dense_prior, jnp.float32), (1,))
  if cfg.dense_prior_encoding == "split":
    if prior_pooled is None:
      pooled2 = prior_pass(*split_rows())
    else:
      pooled2 = jnp.asarray(prior_pooled, jnp.float32)
    if not cfg.dense_prior_gradient:
      pooled2 = jax.lax.stop_gradient(pooled2)  # [S, d]
    p_s, p_q = pooled2, jnp.take(pooled2, q_idx, axis=0)
  else:
    p_s, p_q = h_s, h_q
  # Norms from clamped squared sums: padding spans hold zero vectors, and the gradient of
  # jnp.linalg.norm at 0 is NaN (0 * NaN survives a jnp.maximum).
  norm = lambda x: jnp.sqrt(jnp.maximum(jnp.sum(x * x, -1), 1e-12))  # noqa: E731
  cos = jnp.sum(p_q * p_s, -1) / (norm(p_q) * norm(p_s))
  return scale[0] * cos  # [S]
