"""The steps of `packing.pack_tokenized`, NumPy over all sentences of a call at once.

In order: each sentence's token budget (`sentence_table`), windows cut at sentence boundaries
(`cut_windows`), first-fit decreasing placement of the sequences into rows (`first_fit`), the
span table (`span_table`), the token stream of the sequences (`token_stream`), the rows filled
from it (`fill_rows`) and the graph's node positions (`node_positions`). Only two steps stay
sequential, and both touch a few hundred items per call, not tokens: cutting a passage longer
than one window (only for such passages) and first-fit decreasing over the sequences. The layout
they build is `packing`'s (its module docstring); the bucket sizes are chosen there, between the
steps, so that an overflowing batch fails at the same step as ever.
"""

import dataclasses
from typing import Sequence

import numpy as np

from logrerank_jax.schema import SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
  """[0, x0, x0 + x1, ...] (len(x) + 1 entries, int64)."""
  out = np.zeros(len(x) + 1, np.int64)
  np.cumsum(x, out=out[1:])
  return out


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Concatenation of arange(starts[i], starts[i] + lengths[i]) over i, without a Python loop."""
  lengths = np.asarray(lengths, np.int64)
  total = int(lengths.sum())
  return np.repeat(np.asarray(starts, np.int64) - exclusive_cumsum(lengths)[:-1], lengths) + \
      np.arange(total, dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class Sentences:
  """Sentences of all queries, in (query, passage, sentence) order, with their token budgets.

  S sentences, P passages (of all queries), Q queries.
  """
  pools: dict              # id(token pool) -> (the pool, its offset in the pools concatenated)
  starts: np.ndarray       # [S] first token in the concatenated pools
  sizes: np.ndarray        # [P] sentences per passage
  n_sent_q: np.ndarray     # [Q] sentences per query
  n_sent: int              # S
  sent_q: np.ndarray       # [S] query of a sentence
  pass_q: np.ndarray       # [P] query of a passage
  sent_p: np.ndarray       # [S] passage (global)
  pass_first: np.ndarray   # [P + 1] first sentence of a passage
  q_first_pass: np.ndarray  # [Q + 1] first passage of a query
  node: np.ndarray         # [S] node within its query
  empty: np.ndarray        # bool [S]: no tokens -> one [UNK] token
  truncated: np.ndarray    # bool [S]: longer than a window -> cut to one window
  eff: np.ndarray          # [S] tokens the sentence takes in its window


def sentence_table(queries: Sequence, capacity: np.ndarray) -> Sentences:
  """Every sentence of `queries` (`packing.TokenizedQuery`s), with the tokens it takes:
  one [UNK] when empty, at most `capacity[q]` (room for sentence tokens in one window of
  query q)."""
  nq = len(queries)
  pools: dict[int, tuple[np.ndarray, int]] = {}
  for t in queries:
    if id(t.tokens) not in pools:
      pools[id(t.tokens)] = (t.tokens, sum(len(p) for p, _ in pools.values()))
  cat = lambda arrays, dtype=np.int64: (np.concatenate(arrays).astype(dtype, copy=False)
                                        if arrays else np.zeros(0, dtype))
  starts = cat([t.starts + pools[id(t.tokens)][1] for t in queries])
  lengths = cat([t.lengths for t in queries])
  sizes = cat([t.passage_sizes for t in queries])                   # [P] all passages
  n_pass_q = np.fromiter((len(t.passage_sizes) for t in queries), np.int64, nq)
  n_sent_q = np.fromiter((len(t.lengths) for t in queries), np.int64, nq)
  n_sent = int(n_sent_q.sum())
  sent_q = np.repeat(np.arange(nq), n_sent_q)                       # [S] query of a sentence
  pass_q = np.repeat(np.arange(nq), n_pass_q)                       # [P] query of a passage
  sent_p = np.repeat(np.arange(len(sizes)), sizes)                  # [S] passage (global)
  pass_first = exclusive_cumsum(sizes)                              # [P + 1] first sentence
  q_first_sent = exclusive_cumsum(n_sent_q)
  q_first_pass = exclusive_cumsum(n_pass_q)
  empty = lengths == 0                                              # -> one [UNK] token
  eff = np.maximum(lengths, 1)
  truncated = eff > capacity[sent_q]                                # -> cut to one window
  eff = np.minimum(eff, capacity[sent_q])
  node = np.arange(n_sent) - q_first_sent[sent_q]                   # [S] node within its query
  return Sentences(pools=pools, starts=starts, sizes=sizes, n_sent_q=n_sent_q, n_sent=n_sent,
                   sent_q=sent_q, pass_q=pass_q, sent_p=sent_p, pass_first=pass_first,
                   q_first_pass=q_first_pass, node=node, empty=empty, truncated=truncated,
                   eff=eff)


@dataclasses.dataclass(frozen=True)
class Sequences:
  """The K sequences `[CLS] query [SEP] sentences [SEP]`: one per window, in creation order."""
  seq_first: np.ndarray    # [K] first sentence
  n_seq: int               # K
  window: np.ndarray       # [S] the sequence of a sentence
  seq_sents: np.ndarray    # [K] sentences
  seq_q: np.ndarray        # [K] query
  seq_len: np.ndarray      # [K] tokens, [CLS]/[SEP] included


def cut_windows(sents: Sentences, capacity: np.ndarray, q_len: np.ndarray) -> Sequences:
  """Windows: a passage's sentences in order, a new window when the next one does not fit.
  Most passages fit one window; only the others are cut sentence by sentence."""
  eff, pass_first, sizes, n_sent = sents.eff, sents.pass_first, sents.sizes, sents.n_sent
  pass_q, sent_q = sents.pass_q, sents.sent_q
  cum = exclusive_cumsum(eff)
  passage_tokens = cum[pass_first[1:]] - cum[pass_first[:-1]]
  starts_window = np.zeros(n_sent, bool)
  starts_window[pass_first[:-1][sizes > 0]] = True
  for p in np.flatnonzero(passage_tokens > capacity[pass_q]).tolist():
    cap, used = int(capacity[pass_q[p]]), 0
    s0 = int(pass_first[p])
    for j, n in enumerate(eff[s0:pass_first[p + 1]].tolist()):
      if used and used + n > cap:
        starts_window[s0 + j] = True
        used = 0
      used += n
  seq_first = np.flatnonzero(starts_window)                         # [K] first sentence
  n_seq = len(seq_first)
  window = np.cumsum(starts_window) - 1                             # [S] its sequence
  seq_sents = np.diff(np.append(seq_first, n_sent))
  seq_q = sent_q[seq_first]
  seq_len = q_len[seq_q] + 3 + cum[seq_first + seq_sents] - cum[seq_first]
  return Sequences(seq_first=seq_first, n_seq=n_seq, window=window, seq_sents=seq_sents,
                   seq_q=seq_q, seq_len=seq_len)


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where each sequence went: its row, its first column, its segment id in the row."""
  row_of: np.ndarray       # [K]
  offset_of: np.ndarray    # [K]
  segment_of: np.ndarray   # [K], 1.. per row
  rows: int                # rows holding tokens


def first_fit(seq_len: np.ndarray, row_len: int) -> Placement:
  """First-fit decreasing: longest sequences first (ties: creation order), each into the first
  row with room."""
  n_seq = len(seq_len)
  row_of = np.zeros(n_seq, np.int64)
  offset_of = np.zeros(n_seq, np.int64)
  segment_of = np.zeros(n_seq, np.int64)
  free = np.zeros(n_seq, np.int64)
  filled = np.zeros(n_seq, np.int64)
  rows = 0
  lens_list = seq_len.tolist()
  for i in np.argsort(-seq_len, kind="stable").tolist():
    n = lens_list[i]
    r = int(np.argmax(free[:rows] >= n)) if rows else 0
    if not rows or free[r] < n:
      r, rows = rows, rows + 1
      free[r] = row_len
    offset_of[i] = row_len - free[r]
    free[r] -= n
    filled[r] += 1
    row_of[i], segment_of[i] = r, filled[r]
  return Placement(row_of=row_of, offset_of=offset_of, segment_of=segment_of, rows=rows)


@dataclasses.dataclass(frozen=True)
class SpanTable:
  """The span table (padded to `num_s` spans) and each node's span."""
  q_span: np.ndarray       # [K] query span of a sequence
  s_span: np.ndarray       # [S] span of a sentence
  span_kind: np.ndarray    # int32 [num_s]
  span_query: np.ndarray   # int32 [num_s]
  span_node: np.ndarray    # int32 [num_s]
  node_span: np.ndarray    # int32 [num_q, num_n]


def span_table(sents: Sentences, seqs: Sequences, num_s: int, num_q: int, num_n: int
               ) -> SpanTable:
  """Span table in creation order: per sequence its query span, then its sentences' spans."""
  n_seq, seq_first, window = seqs.n_seq, seqs.seq_first, seqs.window
  n_sent, sent_q, node = sents.n_sent, sents.sent_q, sents.node
  q_span = 1 + np.arange(n_seq) + seq_first                         # [K]
  s_span = np.arange(n_sent) + window + 2                           # [S]
  span_kind = np.full((num_s,), SPAN_NONE, np.int32)
  span_kind[q_span] = SPAN_QUERY
  span_kind[s_span] = SPAN_SENTENCE
  span_query = np.zeros((num_s,), np.int32)
  span_query[s_span] = q_span[window]
  span_node = np.full((num_s,), -1, np.int32)
  span_node[s_span] = sent_q * num_n + node
  node_span = np.zeros((num_q, num_n), np.int32)
  node_span[sent_q, node] = s_span
  return SpanTable(q_span=q_span, s_span=s_span, span_kind=span_kind, span_query=span_query,
                   span_node=span_node, node_span=node_span)


@dataclasses.dataclass(frozen=True)
class TokenStream:
  """The tokens of the sequences in creation order, as indices into one source array."""
  src: np.ndarray          # int32: the pools, then [CLS], [SEP], [UNK], then the cut queries
  token_src: np.ndarray    # [tokens] index into `src` of each token
  piece_len: np.ndarray    # [pieces] tokens per piece
  piece_span: np.ndarray   # [pieces] span id of a piece's tokens (0: not pooled)


def token_stream(sents: Sentences, seqs: Sequences, spans: SpanTable, q_tok: list,
                 q_len: np.ndarray, cls_id: int, sep_id: int, unk_id: int) -> TokenStream:
  """Token stream of the sequences in creation order, gathered in pieces from one source array:
  [CLS] | the query | [SEP] | each sentence (its pool ids, or [UNK] when empty) | [SEP]."""
  pools, empty, starts, eff = sents.pools, sents.empty, sents.starts, sents.eff
  n_sent = sents.n_sent
  n_seq, seq_first, seq_q, window = seqs.n_seq, seqs.seq_first, seqs.seq_q, seqs.window
  seq_sents, q_span, s_span = seqs.seq_sents, spans.q_span, spans.s_span
  pool = np.concatenate([p for p, _ in pools.values()]) if len(pools) > 1 else (
      next(iter(pools.values()))[0] if pools else np.zeros(0, np.int32))
  base = len(pool)
  q_start = base + 3 + exclusive_cumsum(q_len)[:-1]
  src = np.concatenate([pool, np.asarray([cls_id, sep_id, unk_id], np.int32)] + q_tok
                       ).astype(np.int32, copy=False)
  n_pieces = 4 * n_seq + n_sent
  first_piece = 4 * np.arange(n_seq) + seq_first                    # [K]
  piece_src = np.empty(n_pieces, np.int64)
  piece_len = np.ones(n_pieces, np.int64)
  piece_span = np.zeros(n_pieces, np.int64)
  piece_src[first_piece] = base                                     # [CLS]
  piece_src[first_piece + 1] = q_start[seq_q]
  piece_len[first_piece + 1] = q_len[seq_q]
  piece_span[first_piece + 1] = q_span
  piece_src[first_piece + 2] = base + 1                             # [SEP]
  sent_piece = 4 * window + np.arange(n_sent) + 3
  piece_src[sent_piece] = np.where(empty, base + 2, starts)
  piece_len[sent_piece] = eff
  piece_span[sent_piece] = s_span
  piece_src[first_piece + 3 + seq_sents] = base + 1                 # closing [SEP]
  token_src = ranges(piece_src, piece_len)
  return TokenStream(src=src, token_src=token_src, piece_len=piece_len, piece_span=piece_span)


def fill_rows(seqs: Sequences, place: Placement, stream: TokenStream, num_r: int, row_len: int,
              pad_id: int) -> dict[str, np.ndarray]:
  """Scatter the stream into the rows: sequence k at (row_of[k], offset_of[k]).

  Returns:
    {"input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids"}: int32
    [num_r, row_len] each (`packing.PackedBatch`'s token arrays).
  """
  seq_len, row_of, offset_of = seqs.seq_len, place.row_of, place.offset_of
  src, token_src = stream.src, stream.token_src
  real = len(token_src)
  seq_start = exclusive_cumsum(seq_len)[:-1]
  pos = np.arange(real, dtype=np.int64) - np.repeat(seq_start, seq_len)
  dest = np.repeat(row_of * row_len + offset_of, seq_len) + pos
  input_ids = np.full((num_r, row_len), pad_id, np.int32)
  attention_mask = np.zeros((num_r, row_len), np.int32)
  segment_ids = np.zeros((num_r, row_len), np.int32)
  position_ids = np.zeros((num_r, row_len), np.int32)
  span_ids = np.zeros((num_r, row_len), np.int32)
  input_ids.reshape(-1)[dest] = src[token_src]
  attention_mask.reshape(-1)[dest] = 1
  segment_ids.reshape(-1)[dest] = np.repeat(place.segment_of, seq_len)
  position_ids.reshape(-1)[dest] = pos
  span_ids.reshape(-1)[dest] = np.repeat(stream.piece_span, stream.piece_len)
  return {"input_ids": input_ids, "attention_mask": attention_mask, "segment_ids": segment_ids,
          "position_ids": position_ids, "span_ids": span_ids}


def node_positions(sents: Sentences, num_q: int, num_n: int) -> tuple[np.ndarray, np.ndarray]:
  """(node_passage, node_sentence), int32 [num_q, num_n]: each node's passage within its query
  and sentence within its passage; -1 = padding."""
  sent_q, node, sent_p = sents.sent_q, sents.node, sents.sent_p
  node_passage = np.full((num_q, num_n), -1, np.int32)
  node_sentence = np.full((num_q, num_n), -1, np.int32)
  node_passage[sent_q, node] = sent_p - sents.q_first_pass[sent_q]
  node_sentence[sent_q, node] = np.arange(sents.n_sent) - sents.pass_first[sent_p]
  return node_passage, node_sentence
