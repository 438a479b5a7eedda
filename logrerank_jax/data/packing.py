"""Pack (query, passage) sequences into fixed-length rows with segment ids (host-side NumPy).

Layout (contract C5).  Every (query, passage) pair becomes one sequence

    [CLS] query [SEP] s_1 s_2 ... s_m [SEP]

where s_j are the passage's sentences, each tokenised separately without
special tokens (sentence j > 0 is tokenised with a leading space so that
byte-level BPE tokenisers see the same word-initial tokens as in running text;
WordPiece ignores it).  A passage too long for one row is cut into windows at
sentence boundaries; each window repeats `[CLS] query [SEP]` and every sentence
is in exactly one window.  A single sentence longer than a window is truncated
to the window and flagged in `PackInfo`.  A sentence that tokenises to nothing
is given one [UNK] token (so its span is never empty) and flagged too.

Sequences are packed into rows of `row_len` tokens first-fit, in order of
decreasing length (ties: creation order), which is deterministic.  The number
of rows R, spans S, query slots Q and nodes per query N are padded up to the
smallest configured bucket so that jitted consumers see few shapes; a batch
that needs more than the largest bucket raises `ConfigError`.

Span table: span 0 is a dummy; spans are numbered in creation order (query,
passage, window, then the window's query span followed by its sentences).
Graph layout: node n of query q is the n-th sentence of that query in passage
order; its flat index is q * N + n.
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.schema import SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE  # noqa: F401 (re-exported)



def geometric_buckets(stop: int, ratio: float = 1.125, dense_to: int = 8) -> tuple[int, ...]:
  """Every size 1..`dense_to`, then each the last times `ratio` rounded up, ending at `stop`."""
  out = list(range(1, min(dense_to, stop) + 1))
  while out[-1] < stop:
    out.append(min(stop, max(out[-1] + 1, math.ceil(out[-1] * ratio))))
  return tuple(out)


# Row buckets of the inference engine (`inference.default_packing_config`): 1..8 rows, then a
# ladder growing by 1/8 up to 128 (29 shapes), so a call is padded by < 1/8 of its rows.
# Measured with the engine's own call planner (`Reranker._local_calls`, 1,024-token rows,
# all-MiniLM-L6-v2's WordPiece), padding efficiency for 1 / 4 / all queries per rerank call:
#   the shipped demo pools (30 PubMedQA queries x 50 passages): 0.892 / 0.897 / 0.926
#     (multiples of 8 before: 0.704 / 0.911 / 0.953);
#   40 ScholarQABench pools (20 SciFact + 20 PubMed, 50 passages): 0.896 / 0.926 / 0.952
#     (before: 0.766 / 0.905 / 0.924).
# The worst case rises from 0.70 to 0.89; which ladder wins a given batch is bucket luck. Shapes
# compile lazily (a run uses 1-4 of them); `Reranker.precompile` compiles all 29. The training
# packer keeps its coarser default (every micro-batch is padded to one shape there anyway).
INFERENCE_ROW_BUCKETS = geometric_buckets(128)


@dataclasses.dataclass(frozen=True)
class PackingConfig:
  """Row length, shape buckets and query length limit of the packer."""
  row_len: int = 1024
  row_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
  span_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
  node_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
  query_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
  max_query_tokens: int = 64
  space_between_sentences: bool = True

  def __post_init__(self):
    for name in ("row_buckets", "span_buckets", "node_buckets", "query_buckets"):
      b = tuple(getattr(self, name))
      if not b or any(int(x) <= 0 for x in b) or list(b) != sorted(set(b)):
        raise ConfigError(f"PackingConfig.{name} must be a non-empty increasing tuple of positive ints, got {b}")
    if self.max_query_tokens < 1:
      raise ConfigError(f"PackingConfig.max_query_tokens must be >= 1, got {self.max_query_tokens}")
    if self.row_len < self.max_query_tokens + 4:
      raise ConfigError(
          f"PackingConfig.row_len={self.row_len} leaves no room for sentences after "
          f"max_query_tokens={self.max_query_tokens} + [CLS]/[SEP]/[SEP]")


@dataclasses.dataclass(frozen=True)
class QueryInput:
  """One query with its passages, each given as its list of sentences."""
  query: str
  passages: list[list[str]]


@dataclasses.dataclass(frozen=True)
class PackedBatch:
  """Packed token rows, the span table and the graph node layout (NumPy arrays)."""
  input_ids: np.ndarray        # int32 [R, L]
  attention_mask: np.ndarray   # int32 [R, L]
  segment_ids: np.ndarray      # int32 [R, L], 1.. per sequence in a row, 0 = padding
  position_ids: np.ndarray     # int32 [R, L], restart at 0 per segment
  span_ids: np.ndarray         # int32 [R, L], 0 = not pooled, else index into the span table
  span_kind: np.ndarray        # int32 [S], 0 none, 1 query, 2 sentence
  span_query: np.ndarray       # int32 [S], sentence span -> its sequence's query span, else 0
  span_node: np.ndarray        # int32 [S], sentence span -> flat node q * N + n, else -1
  node_passage: np.ndarray     # int32 [Q, N], passage index, -1 = padding
  node_sentence: np.ndarray    # int32 [Q, N], sentence index within passage, -1 = padding
  node_mask: np.ndarray        # bool [Q, N]
  node_span: np.ndarray        # int32 [Q, N], span index of the node, 0 = padding
  num_queries: int             # real queries (<= Q)

  @property
  def Q(self) -> int:  # pylint: disable=invalid-name
    return self.node_mask.shape[0]

  @property
  def N(self) -> int:  # pylint: disable=invalid-name
    return self.node_mask.shape[1]


@dataclasses.dataclass(frozen=True)
class PassagePackInfo:
  """What happened to one passage: windows used, truncated and empty sentences."""
  num_windows: int
  truncated_sentences: tuple[int, ...]
  empty_sentences: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PackInfo:
  """Per-query/per-passage packing report and token counts."""
  passages: tuple[tuple[PassagePackInfo, ...], ...]   # [query][passage]
  query_truncated: tuple[bool, ...]                   # [query]
  num_sequences: int
  num_rows_used: int      # rows holding tokens, before bucket padding
  real_tokens: int        # tokens of the sequences (CLS/SEP included)
  computed_tokens: int    # R * L after bucket padding
  row_len: int            # L

  @property
  def padding_efficiency(self) -> float:
    """Real tokens over computed tokens."""
    return self.real_tokens / max(self.computed_tokens, 1)

  @property
  def row_efficiency(self) -> float:
    """Real tokens over the tokens of the rows actually used (before bucket padding)."""
    return self.real_tokens / max(self.num_rows_used * self.row_len, 1)

  @property
  def truncated(self) -> list[tuple[int, int, int]]:
    """(query, passage, sentence) indices of every truncated sentence."""
    return [(q, p, s) for q, ps in enumerate(self.passages) for p, info in enumerate(ps)
            for s in info.truncated_sentences]


class BucketOverflowError(ConfigError):
  """A batch needs more rows, spans, nodes or query slots than the largest bucket."""


def bucket_size(n: int, buckets: Sequence[int], name: str) -> int:
  """Return the smallest bucket >= n.

  Args:
    n: the size needed.
    buckets: increasing candidate sizes.
    name: config field name for the error message.

  Returns:
    The bucket.

  Raises:
    BucketOverflowError: n is larger than every bucket (the inference engine catches it and
      splits the batch; `grown_buckets` extends a bucket list instead).
  """
  for b in buckets:
    if b >= n:
      return int(b)
  raise BucketOverflowError(f"batch needs {n} but the largest of PackingConfig.{name} is "
                            f"{buckets[-1]}; add a bucket or make the batch smaller")


def grown_buckets(buckets: Sequence[int], n: int) -> tuple[int, ...]:
  """`buckets` extended by doubling its largest until one covers `n` (still a small fixed set
  of shapes: one more compilation per doubling, never one per size)."""
  out = [int(b) for b in buckets]
  while out[-1] < n:
    out.append(out[-1] * 2)
  return tuple(out)


def _validate(queries) -> None:
  """Raise DataError on queries that do not follow QueryInput's types."""
  if not isinstance(queries, (list, tuple)):
    raise DataError(f"pack_queries expects a list of QueryInput, got {type(queries).__name__}")
  for qi, q in enumerate(queries):
    if not isinstance(q, QueryInput):
      raise DataError(f"query {qi}: expected QueryInput, got {type(q).__name__}")
    if not isinstance(q.query, str) or not q.query.strip():
      raise DataError(f"query {qi}: query text must be a non-empty str, got {q.query!r:.40}")
    if not isinstance(q.passages, (list, tuple)):
      raise DataError(f"query {qi}: passages must be a list of sentence lists")
    for pi, p in enumerate(q.passages):
      if not isinstance(p, (list, tuple)):
        raise DataError(f"query {qi} passage {pi}: expected a list of sentences, got {type(p).__name__}")
      for si, s in enumerate(p):
        if not isinstance(s, str):
          raise DataError(f"query {qi} passage {pi} sentence {si}: expected str, got {type(s).__name__}")


def _special_ids(tokenizer) -> tuple[int, int, int, int]:
  """Return (cls, sep, pad, unk) ids of `tokenizer`."""
  ids = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
  names = ("cls_token", "sep_token", "pad_token", "unk_token")
  for n, i in zip(names, ids):
    if i is None:
      raise ConfigError(f"tokenizer has no {n}; packing needs [CLS], [SEP], [PAD] and [UNK]")
  return tuple(int(i) for i in ids)


def pack_queries(queries: Sequence[QueryInput], tokenizer,
                 cfg: Optional[PackingConfig] = None) -> tuple[PackedBatch, PackInfo]:
  """Tokenise and pack queries with their passages' sentences into bucketed rows.

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
  _validate(queries)
  cls_id, sep_id, pad_id, unk_id = _special_ids(tokenizer)
  row_len = cfg.row_len

  # One batched tokeniser call for all queries and sentences (much faster than one per string).
  texts: list[str] = [q.query for q in queries]
  for q in queries:
    for p in q.passages:
      for j, s in enumerate(p):
        texts.append((" " + s) if (j > 0 and cfg.space_between_sentences) else s)
  encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
  query_tokens = [list(t) for t in encoded[:len(queries)]]
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

  num_q = bucket_size(max(len(queries), 1), cfg.query_buckets, "query_buckets")
  num_n = bucket_size(max([len(n) for n in nodes_per_query] + [1]), cfg.node_buckets, "node_buckets")

  # Span table in creation order; each sequence's token ids and span ids.
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

  # First-fit decreasing: longest sequences first, each into the first row with room.
  order = sorted(range(len(sequences)), key=lambda i: (-len(seq_tokens[i]), i))
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

  num_r = bucket_size(max(len(row_items), 1), cfg.row_buckets, "row_buckets")
  num_s = bucket_size(len(span_kind), cfg.span_buckets, "span_buckets")
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

  def pad_table(values, fill):
    out = np.full((num_s,), fill, np.int32)
    out[:len(values)] = values
    return out

  node_passage = np.full((num_q, num_n), -1, np.int32)
  node_sentence = np.full((num_q, num_n), -1, np.int32)
  for qi, nodes in enumerate(nodes_per_query):
    if nodes:
      arr = np.asarray(nodes, np.int32)  # [n_q, 2]
      node_passage[qi, :len(nodes)] = arr[:, 0]
      node_sentence[qi, :len(nodes)] = arr[:, 1]
  batch = PackedBatch(
      input_ids=input_ids, attention_mask=attention_mask, segment_ids=segment_ids,
      position_ids=position_ids, span_ids=span_ids,
      span_kind=pad_table(span_kind, SPAN_NONE), span_query=pad_table(span_query, 0),
      span_node=pad_table(span_node, -1),
      node_passage=node_passage, node_sentence=node_sentence, node_mask=node_passage >= 0,
      node_span=node_span, num_queries=len(queries))
  info = PackInfo(
      passages=tuple(passage_infos), query_truncated=tuple(query_truncated),
      num_sequences=len(sequences), num_rows_used=len(row_items), real_tokens=real,
      computed_tokens=num_r * row_len, row_len=row_len)
  return batch, info


def pack_for_model(queries: Sequence[QueryInput], tokenizer, cfg: Optional[PackingConfig] = None,
                   contextual_encoding: bool = True) -> tuple[PackedBatch, PackInfo]:
  """Pack queries the way a model encodes them: joint passages, or one sentence per sequence.

  With `contextual_encoding` (the full model) this is `pack_queries` unchanged. Without it (the
  ablation "w/o contextual encoding", `LoGConfig.contextual_encoding=False`), every sentence is
  packed as its own one-sentence passage, so each sequence is `[CLS] q [SEP] s_ij [SEP]`; node
  order is unchanged (sentences stay in passage order), and `node_passage`/`node_sentence` are
  mapped back to the real passage and sentence indices so the graph's passage structure
  (adjacency, cross-passage) is the same as in the full model. `PackInfo.passages` is then
  indexed by [query][sentence-sequence] rather than [query][passage].

  Args:
    queries: list of `QueryInput`.
    tokenizer: the fast tokenizer.
    cfg: packer settings (None = default).
    contextual_encoding: the model's `LoGConfig.contextual_encoding`.

  Returns:
    (PackedBatch, PackInfo) as from `pack_queries`.
  """
  if contextual_encoding:
    return pack_queries(queries, tokenizer, cfg)
  exploded, real = [], []
  for q in queries:
    if not isinstance(q, QueryInput):
      return pack_queries(queries, tokenizer, cfg)  # let the packer name the bad record
    exploded.append(QueryInput(q.query, [[s] for p in q.passages for s in p]))
    real.append([(pi, si) for pi, p in enumerate(q.passages) for si in range(len(p))])
  batch, info = pack_queries(exploded, tokenizer, cfg)
  node_passage = np.array(batch.node_passage)
  node_sentence = np.array(batch.node_sentence)
  for qi, nodes in enumerate(real):
    if nodes:
      arr = np.asarray(nodes, np.int32)  # [n_q, 2]
      node_passage[qi, :len(nodes)] = arr[:, 0]
      node_sentence[qi, :len(nodes)] = arr[:, 1]
  return dataclasses.replace(batch, node_passage=node_passage, node_sentence=node_sentence), info
