"""The packer of contract C5 as first written: per-token Python loops (the reference).

`logrerank_jax.data.packing` now packs with NumPy over token ids tokenised once per chunk;
`tests/test_packing_vectorised.py` checks that every array and every report it produces equals
this implementation's, bit for bit, on real pools and on the packer's edge cases (windows,
truncation, empty sentences, several queries, overflowing buckets).
"""

from typing import Optional, Sequence

import numpy as np

from logrerank_jax.data.packing import (PackedBatch, PackingConfig, PackInfo, PassagePackInfo,
                                        QueryInput, bucket_size, special_ids,
                                        validate_queries)
from logrerank_jax.schema import SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE


def reference_pack_queries(queries: Sequence[QueryInput], tokenizer,
                 cfg: Optional[PackingConfig] = None) -> tuple[PackedBatch, PackInfo]:
  """The loop-based packer the engine used until it was vectorised (kept verbatim as the
  reference `packing.pack_queries` must equal bit for bit).

  Args:
    queries: list of `QueryInput` (sentences per passage, already split).
    tokenizer: a `transformers.PreTrainedTokenizerFast` with CLS/SEP/PAD/UNK tokens.
    cfg: packing configuration (default `PackingConfig()`).

  Returns:
    (PackedBatch, PackInfo).

  Raises:
    DataError: malformed `queries`.
    ConfigError: the batch exceeds the largest bucket, or the tokenizer lacks special tokens.
  """
  cfg = cfg or PackingConfig()
  validate_queries(queries)
  cls_id, sep_id, pad_id, unk_id = special_ids(tokenizer)
  row_len = cfg.row_len

  encoded, query_tokens = _tokenize(queries, tokenizer, cfg)
  sequences, passage_infos, query_truncated, nodes_per_query = _sequences(
      queries, encoded, query_tokens, cfg, unk_id)

  num_q = bucket_size(max(len(queries), 1), cfg.query_buckets, "query_buckets")
  num_n = bucket_size(max([len(n) for n in nodes_per_query] + [1]), cfg.node_buckets, "node_buckets")

  span_kind, span_query, span_node, seq_tokens, seq_spans, node_span = _span_table(
      sequences, num_q, num_n, cls_id, sep_id)
  row_items = _first_fit(seq_tokens, row_len)

  num_r = bucket_size(max(len(row_items), 1), cfg.row_buckets, "row_buckets")
  num_s = bucket_size(len(span_kind), cfg.span_buckets, "span_buckets")
  arrays, real = _fill_rows(row_items, seq_tokens, seq_spans, num_r, row_len, pad_id)
  node_passage, node_sentence = _node_tables(nodes_per_query, num_q, num_n)
  batch = PackedBatch(
      **arrays,
      span_kind=_pad_table(span_kind, SPAN_NONE, num_s),
      span_query=_pad_table(span_query, 0, num_s), span_node=_pad_table(span_node, -1, num_s),
      node_passage=node_passage, node_sentence=node_sentence, node_mask=node_passage >= 0,
      node_span=node_span, num_queries=len(queries))
  info = PackInfo(
      passages=tuple(passage_infos), query_truncated=tuple(query_truncated),
      num_sequences=len(sequences), num_rows_used=len(row_items), real_tokens=real,
      computed_tokens=num_r * row_len, row_len=row_len)
  return batch, info


def _tokenize(queries, tokenizer, cfg):
  """(ids of every query and sentence in order, the queries' token lists)."""
  # One batched tokeniser call for all queries and sentences (much faster than one per string).
  texts: list[str] = [q.query for q in queries]
  for q in queries:
    for p in q.passages:
      for j, s in enumerate(p):
        texts.append((" " + s) if (j > 0 and cfg.space_between_sentences) else s)
  encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
  query_tokens = [list(t) for t in encoded[:len(queries)]]
  return encoded, query_tokens


def _sequences(queries, encoded, query_tokens, cfg, unk_id):
  """(sequences, passage infos, query truncated flags, nodes per query): each passage's
  sentences cut into windows, one sequence per window."""
  row_len = cfg.row_len
  cursor = len(queries)

  # Sequences: (query index, query token list, list of (node n, token list)).
  sequences: list[tuple[int, list[int], list[tuple[int, list[int]]]]] = []
  passage_infos: list[tuple[PassagePackInfo, ...]] = []
  query_truncated: list[bool] = []
  nodes_per_query: list[list[tuple[int, int]]] = []  # [(passage, sentence)] per query
  for qi, q in enumerate(queries):
    qtok = query_tokens[qi]
    query_truncated.append(len(qtok) > cfg.max_query_tokens)
    qtok = qtok[:cfg.max_query_tokens] or [unk_id]  # never an empty query span
    capacity = row_len - len(qtok) - 3  # room for sentence tokens in one window
    nodes: list[tuple[int, int]] = []
    infos = []
    for pi, p in enumerate(q.passages):
      truncated, empty = [], []
      windows: list[list[tuple[int, list[int]]]] = []
      current: list[tuple[int, list[int]]] = []
      used = 0
      for si in range(len(p)):
        tok = list(encoded[cursor])
        cursor += 1
        if not tok:
          tok = [unk_id]
          empty.append(si)
        if len(tok) > capacity:
          tok = tok[:capacity]
          truncated.append(si)
        if current and used + len(tok) > capacity:
          windows.append(current)
          current, used = [], 0
        current.append((len(nodes), tok))
        used += len(tok)
        nodes.append((pi, si))
      if current:
        windows.append(current)
      for w in windows:
        sequences.append((qi, qtok, w))
      infos.append(PassagePackInfo(len(windows), tuple(truncated), tuple(empty)))
    passage_infos.append(tuple(infos))
    nodes_per_query.append(nodes)
  return sequences, passage_infos, query_truncated, nodes_per_query


def _span_table(sequences, num_q, num_n, cls_id, sep_id):
  """Span table in creation order; each sequence's token ids and span ids."""
  span_kind, span_query, span_node = [SPAN_NONE], [0], [-1]
  seq_tokens: list[np.ndarray] = []
  seq_spans: list[np.ndarray] = []
  node_span = np.zeros((num_q, num_n), np.int32)
  for qi, qtok, window in sequences:
    q_span = len(span_kind)
    span_kind.append(SPAN_QUERY)
    span_query.append(0)
    span_node.append(-1)
    ids = [cls_id] + qtok + [sep_id]
    sids = [0] + [q_span] * len(qtok) + [0]
    for n, tok in window:
      s_span = len(span_kind)
      span_kind.append(SPAN_SENTENCE)
      span_query.append(q_span)
      span_node.append(qi * num_n + n)
      node_span[qi, n] = s_span
      ids += tok
      sids += [s_span] * len(tok)
    ids.append(sep_id)
    sids.append(0)
    seq_tokens.append(np.asarray(ids, np.int32))
    seq_spans.append(np.asarray(sids, np.int32))
  return span_kind, span_query, span_node, seq_tokens, seq_spans, node_span


def _first_fit(seq_tokens, row_len):
  """First-fit decreasing: longest sequences first, each into the first row with room."""
  order = sorted(range(len(seq_tokens)), key=lambda i: (-len(seq_tokens[i]), i))
  row_free: list[int] = []
  row_items: list[list[int]] = []
  for i in order:
    length = len(seq_tokens[i])
    for r, free in enumerate(row_free):
      if free >= length:
        row_free[r] -= length
        row_items[r].append(i)
        break
    else:
      row_free.append(row_len - length)
      row_items.append([i])
  return row_items


def _fill_rows(row_items, seq_tokens, seq_spans, num_r, row_len, pad_id):
  """(the PackedBatch token arrays by name, real tokens) of the rows' sequences."""
  input_ids = np.full((num_r, row_len), pad_id, np.int32)
  attention_mask = np.zeros((num_r, row_len), np.int32)
  segment_ids = np.zeros((num_r, row_len), np.int32)
  position_ids = np.zeros((num_r, row_len), np.int32)
  span_ids = np.zeros((num_r, row_len), np.int32)
  real = 0
  for r, items in enumerate(row_items):
    off = 0
    for seg, i in enumerate(items, start=1):
      n = len(seq_tokens[i])
      input_ids[r, off:off + n] = seq_tokens[i]
      attention_mask[r, off:off + n] = 1
      segment_ids[r, off:off + n] = seg
      position_ids[r, off:off + n] = np.arange(n, dtype=np.int32)
      span_ids[r, off:off + n] = seq_spans[i]
      off += n
    real += off
  arrays = {"input_ids": input_ids, "attention_mask": attention_mask, "segment_ids": segment_ids,
            "position_ids": position_ids, "span_ids": span_ids}
  return arrays, real


def _pad_table(values, fill, num_s):
  out = np.full((num_s,), fill, np.int32)
  out[:len(values)] = values
  return out


def _node_tables(nodes_per_query, num_q, num_n):
  """(node_passage, node_sentence) of the nodes per query, -1 = padding."""
  node_passage = np.full((num_q, num_n), -1, np.int32)
  node_sentence = np.full((num_q, num_n), -1, np.int32)
  for qi, nodes in enumerate(nodes_per_query):
    if nodes:
      arr = np.asarray(nodes, np.int32)  # [n_q, 2]
      node_passage[qi, :len(nodes)] = arr[:, 0]
      node_sentence[qi, :len(nodes)] = arr[:, 1]
  return node_passage, node_sentence
