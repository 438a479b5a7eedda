"""Pydantic models of the HTTP routes, with each ecosystem's own field names.

  POST /v2/rerank   Cohere v2: {model, query, documents: [str], top_n?, max_tokens_per_doc?,
                    relevant_spans?} -> {id, results: [{index, relevance_score, relevant_spans?}],
                    meta}
  POST /v1/rerank   Jina / vLLM: {model?, query, documents: [str | {text}], top_n?,
                    return_documents?, relevant_spans?} -> {id, model, usage: {total_tokens,
                    prompt_tokens}, results: [{index, relevance_score, document?: {text},
                    relevant_spans?}]}
  POST /rerank      TEI {query, texts, return_text?, raw_scores?, truncate?} -> [{index, score,
                    text?}], or the /v1/rerank shape when the body has `documents`
  POST /log/rerank  one OpenScholar record -> the "log" record of `tools/rerank.py`

Unknown request fields are ignored (clients of these APIs send fields of their own, e.g.
`priority`, `truncation_direction`); a missing or mistyped field is a 422 naming it.
"""

from typing import Any, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag
from typing_extensions import Annotated

_LENIENT = ConfigDict(extra="ignore")


class RelevantSpansRequest(BaseModel):
  """Cohere v2's `relevant_spans` option: return each document's evidence spans."""
  model_config = _LENIENT
  mode: Literal["enabled", "disabled"] = "enabled"
  threshold: float = Field(0.1, ge=0.0, le=1.0,
                           description="only spans scoring at least this (LoG's sentence score; "
                           "Cohere's default 0.1)")
  max_spans: Optional[int] = Field(None, ge=1, description="at most this many spans per document")


class Span(BaseModel):
  """One evidence span: `[start, end)` in Unicode code points of the document text the client
  sent; one of LoG's ranked sentences of that document, with its final score."""
  start: int
  end: int
  score: float


class TextDocument(BaseModel):
  """A document given as an object (Jina, vLLM); only `text` is scored, offsets refer to it."""
  model_config = _LENIENT
  text: str
  title: Optional[str] = None


class CohereRerankRequest(BaseModel):
  model_config = _LENIENT
  model: Optional[str] = None
  query: str
  documents: List[str]
  top_n: Optional[int] = Field(None, ge=1)
  max_tokens_per_doc: Optional[int] = Field(
      None, ge=1, description="cut each document to its first N tokens of the model's tokenizer "
      "(absent: the whole document, windowed)")
  relevant_spans: Optional[RelevantSpansRequest] = None


class JinaRerankRequest(BaseModel):
  model_config = _LENIENT
  model: Optional[str] = None
  query: str
  documents: List[Union[str, TextDocument]]
  top_n: Optional[int] = Field(None, ge=1)
  return_documents: bool = True
  max_tokens_per_doc: Optional[int] = Field(None, ge=1)
  relevant_spans: Optional[RelevantSpansRequest] = None


class TeiRerankRequest(BaseModel):
  model_config = _LENIENT
  query: str
  texts: List[str]
  raw_scores: bool = False
  return_text: bool = False
  truncate: Optional[bool] = Field(
      None, description="accepted for compatibility; LoG windows long texts, it never cuts them")


def _rerank_shape(body: Any) -> Optional[str]:
  if isinstance(body, dict):
    if "texts" in body:
      return "tei"
    if "documents" in body:
      return "jina"
  elif isinstance(body, (TeiRerankRequest, JinaRerankRequest)):
    return "tei" if isinstance(body, TeiRerankRequest) else "jina"
  return None


# POST /rerank: TEI's body has `texts`, Jina's and vLLM's `documents`.
AnyRerankRequest = Annotated[
    Union[Annotated[TeiRerankRequest, Tag("tei")], Annotated[JinaRerankRequest, Tag("jina")]],
    Discriminator(_rerank_shape, custom_error_type="rerank_shape",
                  custom_error_message="the body needs 'texts' (TEI) or 'documents' (Jina/vLLM)")]


class CohereResult(BaseModel):
  index: int
  relevance_score: float
  relevant_spans: Optional[List[Span]] = None


class CohereApiVersion(BaseModel):
  version: str = "2"


class CohereBilledUnits(BaseModel):
  search_units: float = 1


class CohereTokens(BaseModel):
  input_tokens: float
  output_tokens: float = 0


class CohereMeta(BaseModel):
  api_version: CohereApiVersion = CohereApiVersion()
  billed_units: CohereBilledUnits = CohereBilledUnits()
  tokens: Optional[CohereTokens] = None


class CohereRerankResponse(BaseModel):
  id: str
  results: List[CohereResult]
  meta: CohereMeta


class DocumentText(BaseModel):
  text: str


class JinaResult(BaseModel):
  index: int
  relevance_score: float
  document: Optional[DocumentText] = None
  relevant_spans: Optional[List[Span]] = None


class Usage(BaseModel):
  total_tokens: int = Field(description="real tokens the model ran: every window of every "
                            "document with its query, before padding")
  prompt_tokens: int


class JinaRerankResponse(BaseModel):
  id: str
  model: str
  usage: Usage
  results: List[JinaResult]

