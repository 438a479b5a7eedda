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

This module holds the packer's settings, types and entry points; the NumPy steps of
`pack_tokenized` (budgets, windows, row placement, span table, array filling) are in
`packing_steps`.
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from logrerank_jax.data import packing_steps as steps
from logrerank_jax.data.encoding import encode_texts
from logrerank_jax.data.packing_steps import exclusive_cumsum, ranges
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.schema import SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE  # noqa: F401 (re-exported)

__all__ = ["INFERENCE_ROW_BUCKETS", "BucketOverflowError", "PackInfo", "PackedBatch",
           "PackingConfig", "PassagePackInfo", "QueryInput", "SPAN_NONE", "SPAN_QUERY",
           "SPAN_SENTENCE", "TokenizedQuery", "bucket_size", "geometric_buckets", "grown_buckets",
           "pack_for_model", "pack_queries", "pack_tokenized", "pack_tokenized_for_model",
           "special_ids", "tokenize_queries", "validate_queries"]



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


def validate_queries(queries) -> None:
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


def special_ids(tokenizer) -> tuple[int, int, int, int]:
  """Return (cls, sep, pad, unk) ids of `tokenizer`."""
  ids = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
  names = ("cls_token", "sep_token", "pad_token", "unk_token")
  for n, i in zip(names, ids):
    if i is None:
      raise ConfigError(f"tokenizer has no {n}; packing needs [CLS], [SEP], [PAD] and [UNK]")
  return tuple(int(i) for i in ids)


@dataclasses.dataclass(frozen=True)
class TokenizedQuery:
  """One query and its passages' sentences as token ids: what `pack_tokenized` packs.

  Sentence ids live in a flat `tokens` pool that many queries share (one tokeniser call for a
  whole chunk of records, `tokenize_queries`): sentence k (in passage order) is
  `tokens[starts[k]:starts[k] + lengths[k]]`, and passage p holds the next `passage_sizes[p]`
  sentences. Sentence j > 0 of a passage was tokenised with a leading space when the packer's
  `space_between_sentences` asked for it (module docstring).
  """
  query_ids: np.ndarray      # int32 [q], untruncated
  tokens: np.ndarray         # int32 flat pool
  starts: np.ndarray         # int64 [sentences]
  lengths: np.ndarray        # int64 [sentences]
  passage_sizes: np.ndarray  # int64 [passages]: sentences per passage

  def select(self, passages: Sequence[int]) -> "TokenizedQuery":
    """The query with only `passages` (indices, in the order given)."""
    pis = np.asarray(passages, np.int64)
    first = exclusive_cumsum(self.passage_sizes)[:-1]
    sizes = self.passage_sizes[pis]
    idx = ranges(first[pis], sizes)
    return TokenizedQuery(self.query_ids, self.tokens, self.starts[idx], self.lengths[idx], sizes)

  def exploded(self) -> "TokenizedQuery":
    """Every sentence as its own one-sentence passage (the "w/o contextual encoding" layout)."""
    return dataclasses.replace(self, passage_sizes=np.ones(len(self.lengths), np.int64))


def tokenize_queries(queries: Sequence[QueryInput], tokenizer,
                     space_between_sentences: bool = True) -> list[TokenizedQuery]:
  """Tokenise queries and their sentences once, with one batched tokeniser call.

  Args:
    queries: `QueryInput`s (validated by the caller).
    tokenizer: the fast tokenizer.
    space_between_sentences: tokenise sentence j > 0 of a passage as " " + sentence.

  Returns:
    One `TokenizedQuery` per query, all sharing one token pool.
  """
  texts: list[str] = [q.query for q in queries]
  for q in queries:
    for p in q.passages:
      if space_between_sentences:
        texts.extend(s if j == 0 else " " + s for j, s in enumerate(p))
      else:
        texts.extend(p)
  flat, lengths = encode_texts(tokenizer, texts)
  starts = exclusive_cumsum(lengths)[:-1]
  out, cursor = [], len(queries)
  for qi, q in enumerate(queries):
    sizes = np.fromiter(map(len, q.passages), np.int64, len(q.passages))
    n = int(sizes.sum())
    out.append(TokenizedQuery(
        query_ids=flat[starts[qi]:starts[qi] + lengths[qi]],
        tokens=flat, starts=starts[cursor:cursor + n], lengths=lengths[cursor:cursor + n],
        passage_sizes=sizes))
    cursor += n
  return out


def pack_queries(queries: Sequence[QueryInput], tokenizer,
                 cfg: Optional[PackingConfig] = None) -> tuple[PackedBatch, PackInfo]:
  """Tokenise and pack queries with their passages' sentences into bucketed rows.

  Args:
    queries: list of `QueryInput` (sentences per passage, already split).
    tokenizer: a `tokenization.FastTokenizer` (or a transformers fast tokenizer) with
      CLS/SEP/PAD/UNK tokens.
    cfg: packing configuration (default `PackingConfig()`).

  Returns:
    (PackedBatch, PackInfo).

  Raises:
    DataError: malformed `queries`.
    ConfigError: the batch exceeds the largest bucket, or the tokenizer lacks special tokens.
  """
  cfg = cfg or PackingConfig()
  validate_queries(queries)
  special = special_ids(tokenizer)
  return pack_tokenized(tokenize_queries(queries, tokenizer, cfg.space_between_sentences),
                        special, cfg)


def pack_tokenized(queries: Sequence[TokenizedQuery], special: tuple[int, int, int, int],
                   cfg: Optional[PackingConfig] = None) -> tuple[PackedBatch, PackInfo]:
  """Pack tokenised queries into bucketed rows (the packer of this module's docstring).

  NumPy over all sentences at once: only two steps stay sequential, and both touch a few
  hundred items per call, not tokens: cutting a passage longer than one window at sentence
  boundaries (only for such passages) and first-fit decreasing over the sequences. Equal, bit
  for bit, to the loop-based packer it replaced (tests/packing_reference.py).

  Args:
    queries: `TokenizedQuery`s (`tokenize_queries`).
    special: (cls, sep, pad, unk) ids (`special_ids`).
    cfg: packing configuration (default `PackingConfig()`).

  Returns:
    (PackedBatch, PackInfo), as `pack_queries`.

  Raises:
    ConfigError: the batch exceeds the largest bucket.
  """
  cfg = cfg or PackingConfig()
  cls_id, sep_id, pad_id, unk_id = special
  row_len = cfg.row_len
  nq = len(queries)

  # Queries: cut at max_query_tokens, never empty (one [UNK]).
  query_truncated = tuple(len(t.query_ids) > cfg.max_query_tokens for t in queries)
  unk = np.asarray([unk_id], np.int32)
  q_tok = [t.query_ids[:cfg.max_query_tokens] if len(t.query_ids) else unk for t in queries]
  q_len = np.fromiter(map(len, q_tok), np.int64, nq)
  capacity = row_len - q_len - 3  # room for sentence tokens in one window, per query

  # The steps (packing_steps), each bucket chosen as soon as its size is known.
  sents = steps.sentence_table(queries, capacity)
  seqs = steps.cut_windows(sents, capacity, q_len)
  num_q = bucket_size(max(nq, 1), cfg.query_buckets, "query_buckets")
  num_n = bucket_size(max(int(sents.n_sent_q.max(initial=0)), 1), cfg.node_buckets, "node_buckets")
  place = steps.first_fit(seqs.seq_len, row_len)
  num_r = bucket_size(max(place.rows, 1), cfg.row_buckets, "row_buckets")
  num_s = bucket_size(1 + seqs.n_seq + sents.n_sent, cfg.span_buckets, "span_buckets")
  spans = steps.span_table(sents, seqs, num_s, num_q, num_n)
  stream = steps.token_stream(sents, seqs, spans, q_tok, q_len, cls_id, sep_id, unk_id)
  token_arrays = steps.fill_rows(seqs, place, stream, num_r, row_len, pad_id)
  node_passage, node_sentence = steps.node_positions(sents, num_q, num_n)

  batch = PackedBatch(
      **token_arrays, span_kind=spans.span_kind, span_query=spans.span_query,
      span_node=spans.span_node, node_passage=node_passage, node_sentence=node_sentence,
      node_mask=node_passage >= 0, node_span=spans.node_span, num_queries=nq)
  info = PackInfo(
      passages=_passage_report(sents, seqs, nq), query_truncated=query_truncated,
      num_sequences=seqs.n_seq, num_rows_used=place.rows, real_tokens=len(stream.token_src),
      computed_tokens=num_r * row_len, row_len=row_len)
  return batch, info


def _passage_report(sents: steps.Sentences, seqs: steps.Sequences, nq: int
                    ) -> tuple[tuple[PassagePackInfo, ...], ...]:
  """Per-passage report, [query][passage]: windows, and the (rare) truncated and empty
  sentences."""
  sent_p, pass_first, sizes = sents.sent_p, sents.pass_first, sents.sizes
  q_first_pass = sents.q_first_pass
  windows = np.bincount(sent_p[seqs.seq_first], minlength=len(sizes)).tolist()
  flagged = {}
  for key, mask in (("truncated", sents.truncated), ("empty", sents.empty)):
    for s in np.flatnonzero(mask).tolist():
      p = int(sent_p[s])
      flagged.setdefault((key, p), []).append(s - int(pass_first[p]))
  infos = [PassagePackInfo(windows[p], tuple(flagged.get(("truncated", p), ())),
                           tuple(flagged.get(("empty", p), ()))) for p in range(len(sizes))]
  return tuple(tuple(infos[q_first_pass[q]:q_first_pass[q + 1]]) for q in range(nq))


def pack_tokenized_for_model(queries: Sequence[TokenizedQuery], special: tuple[int, int, int, int],
                             cfg: Optional[PackingConfig] = None, contextual_encoding: bool = True
                             ) -> tuple[PackedBatch, PackInfo]:
  """`pack_tokenized` the way a model encodes: joint passages, or one sentence per sequence.

  Without `contextual_encoding` the queries must have been tokenised with
  `space_between_sentences=False` (every sentence starts its own sequence); see
  `pack_for_model`.
  """
  if contextual_encoding:
    return pack_tokenized(queries, special, cfg)
  batch, info = pack_tokenized([q.exploded() for q in queries], special, cfg)
  node_passage = np.array(batch.node_passage)
  node_sentence = np.array(batch.node_sentence)
  for qi, q in enumerate(queries):
    n = len(q.lengths)
    node_passage[qi, :n] = np.repeat(np.arange(len(q.passage_sizes)), q.passage_sizes)
    node_sentence[qi, :n] = np.arange(n) - np.repeat(
        exclusive_cumsum(q.passage_sizes)[:-1], q.passage_sizes)
  return dataclasses.replace(batch, node_passage=node_passage, node_sentence=node_sentence), info


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
  cfg = cfg or PackingConfig()
  validate_queries(queries)
  special = special_ids(tokenizer)
  # Each sentence is the first of its own passage: no leading space.
  tokens = tokenize_queries(queries, tokenizer, space_between_sentences=False)
  return pack_tokenized_for_model(tokens, special, cfg, contextual_encoding=False)
