"""Output formats made from a typed result besides its own "log" format (`to_dict()`): the
OpenScholar generation input (`to_openscholar`)."""

from typing import Any

from logrerank_jax.results.typed import Result


def to_openscholar(raw: Any, result: Result) -> dict:
  """Write an input record back with its passages reordered (OpenScholar generation input).

  Every input field is kept; the passage list (`ctxs` or `passages`, whichever the input used)
  is reordered by `passage_ranking`, each passage object unchanged. Added keys:
  `log_passage_order` (original indices, best first) and `log_context` (the context units: their
  `passage` is the ORIGINAL index, and `ctx_position` the unit's position in the reordered
  list written here). A failed record is written back unchanged with an `error` field (a line
  that was not a JSON object becomes {"error", "line"}).

  Args:
    raw: the parsed input object.
    result: its `RerankResult` / `RecordError` (or their `to_dict()`).

  Returns:
    The output object.
  """
  res = result.to_dict() if hasattr(result, "to_dict") else result
  if res.get("error") is not None:
    if isinstance(raw, dict):
      return {**raw, "error": res["error"]}
    return {"error": res["error"], "line": res.get("line")}
  out = dict(raw)
  pkey = "ctxs" if "ctxs" in raw else "passages"
  out[pkey] = [raw[pkey][p] for p in res["passage_ranking"]]
  out["log_passage_order"] = list(res["passage_ranking"])
  position = {p: i for i, p in enumerate(res["passage_ranking"])}
  out["log_context"] = [dict(u, ctx_position=position[u["passage"]]) for u in res["context"]]
  return out
