"""Host side of the reranking engine: cutting records into bucketed device calls.

Any pool size, default settings.  The local stage runs over as many packed calls as the records
need: their passages are cut into calls that fit the largest row/span/node bucket
(`Planner.local_calls`; a query may spread over several calls, and since a local score depends
only on its (query, passage) sequence this changes no score), `local_slots` query slots per
call, each call packed into the smallest row bucket that holds it (`Planner.pack_call`). The
global stage then runs on each query's whole sentence graph, `queries_per_batch` queries per
call (`Planner.global_jobs`), with node buckets grown by doubling when a query has more
sentences than the largest bucket: a query's graph is never cut. Both stages see only a small
fixed set of shapes (query slots, rows, spans, nodes all bucketed), so they compile once per
bucket (`Planner.local_shapes`, `Planner.node_buckets`). The limit left is memory.

Pure host code (tokeniser and NumPy): it can run on worker threads ahead of the devices, each
with its own copy of the tokenizer. A group of records is tokenised once (`Planner.tokenize`, one
batched tokeniser call, most of the host work): the plan counts those ids and the calls pack
them.
"""

import dataclasses
from typing import List, Optional, Sequence

import numpy as np

from logrerank_jax.data.inference_input import InferenceRecord
from logrerank_jax.data.packing import (INFERENCE_ROW_BUCKETS, BucketOverflowError,
                                        PackingConfig, QueryInput, TokenizedQuery,
                                        bucket_size, grown_buckets, pack_tokenized_for_model,
                                        special_ids, tokenize_queries,
                                        validate_queries)
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.schema import MODEL_KEYS, NODE_KEYS, NUM_ROLES, SPAN_KEYS, TOKEN_KEYS

# Queries up to this many tokens are never cut by default: real scientific questions and claims
# fit (a 20-word SciFact claim is ~30 WordPiece tokens under a real vocabulary, ~110 under a
# 1,024-word demo vocabulary).
DEFAULT_MAX_QUERY_TOKENS = 128
# Query slots per local call: a full 128-row call of 1,024-token rows holds ~9 fifty-passage
# pools, so 16 slots rarely bind.
DEFAULT_LOCAL_SLOTS = 16
# A call is cut at this fraction of its largest row bucket's tokens: first-fit decreasing packs
# real pools to ~97-99% of the rows it opens, and an overflowing call is split, not lost.
CALL_FILL = 0.95
# Span table of a row bucket: one span per this many tokens (real text: ~25-30 tokens per
# sentence); a denser call moves to the next row bucket (or is split), never fails.
TOKENS_PER_SPAN = 8


def default_packing_config(cfg: lr.LoGConfig, row_len: Optional[int] = None,
                           max_query_tokens: Optional[int] = None, **buckets) -> PackingConfig:
  """Packer settings for inference.

  Rows of `row_len` tokens (default 1024, the paper's input limit), capped by the encoder's
  positions (`max_positions`: 512 for BERT, 512 for RoBERTa's 514 offset embeddings); queries
  cut at `max_query_tokens` (default `DEFAULT_MAX_QUERY_TOKENS`, at most half a row so
  passages keep room); `buckets` (row_buckets, span_buckets,
  node_buckets) override the packer's defaults. Any pool size works with any buckets: the
  engine splits a query over several local calls and grows node buckets (module docstring).
  """
  row_len = min(int(row_len or 1024), cfg.local.encoder.max_positions)
  mqt = int(max_query_tokens) if max_query_tokens else min(DEFAULT_MAX_QUERY_TOKENS, row_len // 2)
  buckets = {k: tuple(v) for k, v in buckets.items() if v}
  buckets.setdefault("row_buckets", INFERENCE_ROW_BUCKETS)
  return PackingConfig(row_len=row_len, max_query_tokens=mqt, **buckets)


def pad_local(batch, rows: int, spans: int, nodes: int, pad_id: int) -> dict:
  """A packed batch's model arrays padded to (rows, spans, nodes per slot) with inert entries
  (padding rows, empty spans, masked nodes); span_node's flat q * N + n is re-based on `nodes`."""
  out = {}
  r0 = batch.input_ids.shape[0]
  for k in TOKEN_KEYS:
    a = getattr(batch, k)
    fill = pad_id if k == "input_ids" else 0
    out[k] = np.concatenate([a, np.full((rows - r0, a.shape[1]), fill, a.dtype)]) if rows > r0 else a
  s0 = batch.span_kind.shape[0]
  n0 = batch.N
  for k in SPAN_KEYS:
    a = getattr(batch, k)
    if k == "span_node":
      a = np.where(a >= 0, (a // n0) * nodes + a % n0, -1).astype(a.dtype)
    out[k] = np.concatenate([a, np.full((spans - s0,), -1 if k == "span_node" else 0, a.dtype)])
  for k in NODE_KEYS:
    a = getattr(batch, k)
    fill = -1 if k == "node_passage" else False
    out[k] = np.concatenate([a, np.full((a.shape[0], nodes - n0), fill, a.dtype)], axis=1)
  return out


def global_arrays(size: int, n: int, d: int) -> dict:
  """Empty global-stage inputs for `size` query slots of `n` nodes of width `d`."""
  return {"h": np.zeros((size, n, d), np.float32),
          "role_probs": np.zeros((size, n, NUM_ROLES), np.float32),
          "local_score": np.zeros((size, n), np.float32),
          "local_logit": np.zeros((size, n), np.float32),
          "node_passage": np.full((size, n), -1, np.int32),
          "node_mask": np.zeros((size, n), bool)}


class Planner:
  """Cuts parsed records into the bucketed local and global calls of one model."""

  def __init__(self, cfg: lr.LoGConfig, tokenizer, packing: PackingConfig,
               queries_per_batch: int, local_slots: int):
    """Args:
      cfg: the model's `LoGConfig` (contextual encoding, encoder width).
      tokenizer: its fast tokenizer (the default for every method's `tokenizer`).
      packing: packer settings; its `query_buckets` are replaced by `(queries_per_batch,)` so
        every global call has the same number of query slots.
      queries_per_batch: queries per global-stage call (whole query graphs).
      local_slots: query slots per local-stage call.
    """
    self.cfg = cfg
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.local_slots = local_slots
    self.packing = dataclasses.replace(packing, query_buckets=(queries_per_batch,))
    self.local_packing = dataclasses.replace(self.packing, query_buckets=(local_slots,))
    self.pad_id = int(tokenizer.pad_token_id or 0) if tokenizer is not None else 0

  # ------------------------------------------------------------------------------- shapes

  def rung(self, rows: int):
    """(spans, nodes per slot) of a local call of `rows` rows: spans for one per
    `TOKENS_PER_SPAN` tokens (capped by the largest span bucket), nodes as many as spans
    (capped by the largest node bucket), each rounded up to a configured bucket."""
    pk = self.packing
    want = max(rows * pk.row_len // TOKENS_PER_SPAN, 1)
    s = next((b for b in pk.span_buckets if b >= want), pk.span_buckets[-1])
    n = next(b for b in pk.node_buckets if b >= min(s, pk.node_buckets[-1]))
    return int(s), int(n)

  def local_shape(self, rows: int, spans: int, nodes: int):
    """(rows, spans, nodes per slot) of the smallest row bucket that holds a call; the span
    table and node slots of a row bucket are fixed (`rung`), so each row bucket is one shape.
    None when no row bucket holds it."""
    for r in self.packing.row_buckets:
      if r >= rows:
        s, n = self.rung(r)
        if s >= spans and n >= nodes:
          return r, s, n
    return None

  def local_shapes(self) -> List[tuple]:
    """Every (rows, spans, nodes per slot) a local call can have (one per row bucket), for
    calls that fit the buckets; a passage larger than every bucket adds a grown shape."""
    return [(r,) + self.rung(r) for r in self.packing.row_buckets]

  def local_example(self, rows: int, spans: int, nodes: int) -> dict:
    """Zero model arrays of one local call of this shape (what `precompile` compiles)."""
    arrays = {k: np.zeros((rows, self.packing.row_len), np.int32) for k in TOKEN_KEYS}
    arrays.update({k: np.zeros((spans,), np.int32) for k in SPAN_KEYS})
    arrays.update(node_passage=np.zeros((self.local_slots, nodes), np.int32),
                  node_mask=np.zeros((self.local_slots, nodes), bool))
    return arrays

  def global_example(self, nodes: int) -> dict:
    """Empty inputs of one global call of `nodes` nodes per query slot."""
    return global_arrays(self.queries_per_batch, nodes, self.cfg.local.encoder.hidden_size)

  # ------------------------------------------------------------------------------- local

  def tokenize(self, records: Sequence[InferenceRecord], tokenizer=None) -> List[TokenizedQuery]:
    """Each record's query and sentences as token ids, from one batched tokeniser call for the
    whole group: the ids the plan counts (`token_counts`) and the calls pack (`pack_call`), so
    the text is tokenised once. Sentences are tokenised as the model's packing tokenises them
    (`pack_for_model`: a leading space on sentence j > 0 of a passage with contextual encoding
    and `space_between_sentences`, none without contextual encoding).

    Raises:
      DataError: a record that breaks `QueryInput`'s types (e.g. an empty query).
    """
    queries = [QueryInput(r.query, r.sentence_texts) for r in records]
    validate_queries(queries)
    space = self.cfg.contextual_encoding and self.local_packing.space_between_sentences
    return tokenize_queries(queries, tokenizer or self.tokenizer, space)

  def token_counts(self, records: Sequence[InferenceRecord], tokenizer=None, tokens=None):
    """(query tokens, tokens per passage) of each record: the cost used to cut queries into
    calls that fit the buckets, counted on `tokens` (the records' `tokenize` output; tokenised
    here when None). A passage counts one token more per sentence than its sentences' ids."""
    if tokens is None:
      tokens = self.tokenize(records, tokenizer)
    out = []
    for t in tokens:
      cum = np.concatenate([[0], np.cumsum(t.lengths + 1)])
      ends = np.cumsum(t.passage_sizes)
      out.append((len(t.query_ids), (cum[ends] - cum[ends - t.passage_sizes]).tolist()))
    return out

  def passage_items(self, records: Sequence[InferenceRecord], tokenizer=None,
                    tokens=None) -> list:
    """(record, passage, tokens, spans, nodes) of every scorable passage, in order: the tokens
    of its windows (the query repeated in each), its span-table entries and its sentences.
    `tokens`: the records' `tokenize` output (tokenised here when None)."""
    pk = self.packing
    row_len = pk.row_len
    counts = self.token_counts(records, tokenizer, tokens)
    items = []
    for ri, rec in enumerate(records):
      q_len, p_lens = counts[ri]
      qtok = min(q_len, pk.max_query_tokens) + 3  # [CLS] q [SEP] ... [SEP] in every window
      for pi, psg in enumerate(rec.passages):
        n = len(psg.sentences)
        if n == 0:
          continue
        if not self.cfg.contextual_encoding:  # one sequence per sentence
          windows = n
        else:
          windows = max(1, -(-p_lens[pi] // max(row_len - qtok, 1)))
        items.append((ri, pi, p_lens[pi] + windows * qtok, n + windows, n))
    return items

  def record_tokens(self, records: Sequence[InferenceRecord], tokenizer=None) -> List[int]:
    """Real tokens the local stage runs for each record (all its windows, before padding)."""
    out = [0] * len(records)
    for ri, _, tokens, _, _ in self.passage_items(records, tokenizer):
      out[ri] += tokens
    return out

  def local_calls(self, records: Sequence[InferenceRecord], tokenizer=None, tokens=None):
    """Cut the records' scorable passages into nearly full local-stage calls.

    The passages of all `records` (in order) are cut into the fewest calls that fit the
    largest row bucket at `CALL_FILL` of its tokens, the span table and `local_slots` slots,
    with the tokens balanced over the calls (so the last call is not a small remainder). A slot
    is (record index, passage indices) of one record: a query may spread over several slots and
    calls (local scores depend only on the (query, passage) sequence, so this changes no score).
    `tokens`: the records' `tokenize` output (tokenised here when None). Returns a list of
    calls, each a list of slots.
    """
    pk = self.packing
    max_rows = pk.row_buckets[-1]
    span_budget, node_budget = self.rung(max_rows)
    span_budget -= 1  # span 0 is the dummy
    token_budget = int(CALL_FILL * max_rows * pk.row_len)
    items = self.passage_items(records, tokenizer, tokens)
    total = sum(t for _, _, t, _, _ in items)
    n_calls = max(1, -(-total // token_budget),
                  -(-sum(sp for _, _, _, sp, _ in items) // span_budget))
    target = total / n_calls
    calls, cur, used_tokens, used_spans, done = [], [], 0, 0, 0
    slot, slot_nodes = None, 0
    for ri, pi, tokens, spans, n in items:
      new_slot = slot is None or slot[0] != ri or slot_nodes + n > node_budget
      full = cur and (used_tokens + tokens > token_budget or used_spans + spans > span_budget
                      or (new_slot and len(cur) == self.local_slots)
                      # balanced cut: the call's share of the chunk's tokens is reached
                      or done + tokens / 2 > (len(calls) + 1) * target)
      if full:
        calls.append(cur)
        cur, used_tokens, used_spans, slot = [], 0, 0, None
      if slot is None or new_slot:
        slot, slot_nodes = (ri, []), 0
        cur.append(slot)
      slot[1].append(pi)
      slot_nodes += n
      used_tokens += tokens
      used_spans += spans
      done += tokens
    if cur:
      calls.append(cur)
    return calls

  def pack_call(self, records, call, tokenizer=None, tokens=None):
    """Pack one local call into its row bucket's shape: [(slots, model arrays, PackInfo)].

    `tokens` holds the records' `tokenize` output (indexed by record) when the caller tokenised
    them already; else the call's records are tokenised here. Each slot packs its passages'
    ids, the same arrays `pack_for_model` makes from their text. A call that overflows the
    largest bucket is split in halves, and a single passage too large for every bucket gets
    grown buckets (one more shape, not an error)."""
    tokenizer = tokenizer or self.tokenizer
    if tokens is None:
      used = sorted({ri for ri, _ in call})
      tokens = dict(zip(used, self.tokenize([records[ri] for ri in used], tokenizer)))
    queries = [tokens[ri].select(pis) for ri, pis in call]
    special = special_ids(tokenizer)
    try:
      batch, info = pack_tokenized_for_model(queries, special, self.local_packing,
                                             self.cfg.contextual_encoding)
      spans = int(np.flatnonzero(batch.span_kind).max(initial=0)) + 1
      shape = self.local_shape(info.num_rows_used, spans, int(batch.node_mask.sum(1).max()))
      if shape is None:
        raise BucketOverflowError("call does not fit a row bucket's span table or node slots")
      return [(call, pad_local(batch, *shape, self.pad_id), info)]
    except BucketOverflowError:
      if len(call) > 1 or len(call[0][1]) > 1:
        if len(call) > 1:
          halves = [call[:len(call) // 2], call[len(call) // 2:]]
        else:
          (ri, pis), = call
          halves = [[(ri, pis[:len(pis) // 2])], [(ri, pis[len(pis) // 2:])]]
        return [part for h in halves for part in self.pack_call(records, h, tokenizer, tokens)]
    # One passage alone overflows: grow every bucket to cover it.
    big = dataclasses.replace(self.local_packing,
                              row_buckets=grown_buckets(self.packing.row_buckets, 1 << 20),
                              span_buckets=grown_buckets(self.packing.span_buckets, 1 << 22),
                              node_buckets=grown_buckets(self.packing.node_buckets, 1 << 22))
    batch, info = pack_tokenized_for_model(queries, special, big, self.cfg.contextual_encoding)
    return [(call, {k: getattr(batch, k) for k in MODEL_KEYS}, info)]

  def local_jobs(self, records: Sequence[InferenceRecord], tokenizer=None) -> list:
    """Host work of a group of records (tokenise once, plan the local calls, pack them): the
    local-stage jobs `(model arrays, (slots, model arrays, PackInfo))` the engine runs."""
    tokens = self.tokenize(records, tokenizer)
    return [(arrays, (part, arrays, info))
            for call in self.local_calls(records, tokenizer, tokens)
            for part, arrays, info in self.pack_call(records, call, tokenizer, tokens)]

  def passage_info_of(self, rec: InferenceRecord, pis, infos) -> list:
    """Per packed passage (num_windows, truncated, empty), for the passages `pis` of `rec`."""
    if self.cfg.contextual_encoding:
      return [(i.num_windows, list(i.truncated_sentences), list(i.empty_sentences)) for i in infos]
    # "w/o contextual encoding": PackInfo has one entry per sentence, in passage order.
    out, k = [], 0
    for pi in pis:
      mine = infos[k:k + len(rec.passages[pi].sentences)]
      k += len(rec.passages[pi].sentences)
      out.append((len(mine), [s for s, i in enumerate(mine) if i.truncated_sentences],
                  [s for s, i in enumerate(mine) if i.empty_sentences]))
    return out

  def packed_passages(self, records: Sequence[InferenceRecord], jobs: list):
    """What packing the local `jobs` did to each record, known before they run: per record
    {passage: (windows, truncated sentences, empty sentences)} (`passage_info_of`) and
    whether its query was cut to the query token limit."""
    windows = [dict() for _ in records]  # per record: pi -> (windows, trunc, empty)
    truncated_q = [False] * len(records)
    for _, (part, _, info) in jobs:
      for slot, (ri, pis) in enumerate(part):
        truncated_q[ri] |= bool(info.query_truncated[slot])
        for lp, pinfo in zip(pis, self.passage_info_of(records[ri], pis, info.passages[slot])):
          windows[ri][lp] = pinfo
    return windows, truncated_q

  # ------------------------------------------------------------------------------- global

  def global_jobs(self, nodes: List[List[tuple]]) -> list:
    """Group whole query graphs into global-stage calls of `queries_per_batch` queries.

    Args:
      nodes: per record, its sentence nodes
        `(passage, sentence, h, role_probs, local_score, local_logit)`;
        sorted in place into passage order (as one joint packing would give them).

    Returns:
      Jobs `(features, (record indices, features))`, one per group; a group's node bucket is
      the smallest that holds its largest graph (grown by doubling past the largest bucket).
    """
    size = self.queries_per_batch
    d = self.cfg.local.encoder.hidden_size
    jobs = []
    for start in range(0, len(nodes), size):
      group = list(range(start, min(start + size, len(nodes))))
      for ri in group:
        nodes[ri].sort(key=lambda t: (t[0], t[1]))
      n_max = max([len(nodes[ri]) for ri in group] + [1])
      n = bucket_size(n_max, grown_buckets(self.packing.node_buckets, n_max), "node_buckets")
      feats = global_arrays(size, n, d)
      for q, ri in enumerate(group):
        for j, (pi, _, h, roles, z, logit) in enumerate(nodes[ri]):
          feats["h"][q, j], feats["role_probs"][q, j], feats["local_score"][q, j] = h, roles, z
          feats["local_logit"][q, j] = logit
          feats["node_passage"][q, j] = pi
        feats["node_mask"][q, :len(nodes[ri])] = True
      jobs.append((feats, (group, feats)))
    return jobs
