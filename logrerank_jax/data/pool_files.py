"""Pool files on the engine's input path: id-only pools (`ctx_ids`) resolved against a corpus.

`logrerank rerank --corpus`, the server's demo pools and the evaluators read pools through these
(`expand_pools`, `read_pool_file`, `read_corpus`, `resolve_pool`); building pools from task
files is offline work and lives in `logrerank_jax.datasets.pools`.
"""

from typing import Mapping, Sequence

from logrerank_jax.data.jsonl import read_json_lines
from logrerank_jax.errors import DataError


def expand_pools(pool_records: Sequence[dict],
                 corpus: Sequence[dict] | Mapping[str, dict]) -> list[dict]:
  """Resolve id-only pools (`{"id", "input", "ctx_ids": [...]}`, as `tools/build_demo_data.py`
  ships them) into OpenScholar pools with full ctxs from `corpus`: entries `{"id", "title",
  "text"}`, or `read_corpus`'s {id: entry}. Each pool as `resolve_pool` resolves it.

  Records that carry `ctxs` (and no `ctx_ids`) pass through unchanged.

  Raises:
    DataError: a corpus entry is not an object with an id, or an id repeats; a pool names a
      passage id the corpus lacks, or carries both `ctxs` and `ctx_ids` (names the pool).
  """
  by_id = corpus if isinstance(corpus, Mapping) else index_corpus(corpus)
  return [resolve_pool(rec, by_id, where=f"pool {n}")
          for n, rec in enumerate(pool_records, start=1)]


def _json_lines(path: str, what: str):
  """(line number, JSON value) of each non-blank line of `path`.

  Raises:
    DataError: the file cannot be read ("cannot read `what` ..."), or a line is not JSON (names
      the file and line).
  """
  for n, value, error in read_json_lines(path, lambda why: f"cannot read {what} {path} ({why})"):
    if error is not None:
      raise DataError(f"{path}:{n}: malformed JSON ({error})") from None
    yield n, value


def _index_by_id(located) -> dict[str, dict]:
  """{id as a string: entry} of (where, entry) pairs; `where` names an entry in its error."""
  by_id: dict[str, dict] = {}
  for where, entry in located:
    pid = entry.get("id") if isinstance(entry, dict) else None
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
      raise DataError(f"{where}: expected a JSON object with an 'id' (string or integer)")
    if str(pid) in by_id:
      raise DataError(f"{where}: passage id {str(pid)!r} repeats")
    by_id[str(pid)] = entry
  return by_id


def index_corpus(entries: Sequence[dict], source: str = "corpus") -> dict[str, dict]:
  """Corpus entries `{"id", "title", "text"}` as {id as a string: entry}, as `read_corpus`.

  Raises:
    DataError: an entry is not an object with an `id` (string or integer), or an id repeats
      (names `source` and the entry's position, from 1).
  """
  return _index_by_id((f"{source} entry {n}", e) for n, e in enumerate(entries, start=1))


def read_pool_file(path: str) -> list:
  """The JSON values of a pool file's non-blank lines (`expand_pools` and the pool readers
  check what they hold).

  Raises:
    DataError: the file cannot be read, or a line is not JSON (names the file and line).
  """
  return [value for _, value in _json_lines(path, "pools")]


def read_corpus(path: str) -> dict[str, dict]:
  """Read a passage corpus, JSONL `{"id", "title", "text"}`, into {id as a string: entry}.

  Raises:
    DataError: the file cannot be read, or a line is not a JSON object with an `id` (string or
      integer), or an id repeats (names the file and line).
  """
  return _index_by_id((f"{path}:{n}", e) for n, e in _json_lines(path, "corpus"))


def resolve_pool(rec: dict, by_id: Mapping[str, dict], where: str = "record") -> dict:
  """One id-only pool (`ctx_ids`) with its passages from a corpus (`read_corpus`); a record
  without `ctx_ids` is returned unchanged.

  Raises:
    DataError: `ctx_ids` is not a list, or names a passage the corpus lacks (names `where`, the
      record's id and the first missing passage id), or the record also carries `ctxs` (which
      of the two is the pool would be a guess).
  """
  if "ctx_ids" not in rec:
    return rec
  ids = rec["ctx_ids"]
  if not isinstance(ids, list):
    raise DataError(f"{where}: 'ctx_ids' must be a list of passage ids, got {type(ids).__name__}")
  if "ctxs" in rec:
    raise DataError(f"{where}: pool {rec.get('id')!r} has both 'ctxs' and 'ctx_ids'; give one")
  missing = [i for i in ids if str(i) not in by_id]
  if missing:
    raise DataError(f"{where}: pool {rec.get('id')!r}: passage id {str(missing[0])!r} is not in "
                    f"the corpus ({len(missing)} of its {len(ids)} ids missing)")
  # A corpus entry without a text gives a passage without one: the reader skips that passage
  # with its reason, as it skips any unusable passage.
  ctxs = [{"id": str(i), "title": by_id[str(i)].get("title", "")}
          | ({"text": by_id[str(i)]["text"]} if "text" in by_id[str(i)] else {}) for i in ids]
  return {k: v for k, v in rec.items() if k != "ctx_ids"} | {"ctxs": ctxs}
