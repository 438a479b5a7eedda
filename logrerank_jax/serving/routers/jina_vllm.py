"""POST /v1/rerank: Jina / vLLM rerank (documents as strings or `{text}` objects; also takes
`relevant_spans`). `jina_response` also answers POST /rerank when its body has `documents`."""

from fastapi import APIRouter, Depends, Request

from logrerank_jax.serving import schemas
from logrerank_jax.serving.auth import require_key
from logrerank_jax.serving.scoring import relevance, score, spans
from logrerank_jax.serving.state import ServingState, serving_state

router = APIRouter(dependencies=[Depends(require_key)])


def usage(tokens: int) -> schemas.Usage:
  return schemas.Usage(total_tokens=tokens, prompt_tokens=tokens)


async def jina_response(req: schemas.JinaRerankRequest, request: Request,
                        state: ServingState) -> schemas.JinaRerankResponse:
  """A Jina / vLLM request through the engine, answered in Jina's shape."""
  docs = [{"text": d, "title": ""} if isinstance(d, str) else {"text": d.text, "title": d.title or ""}
          for d in req.documents]
  ranked, tokens, _ = await score(state, req.query, docs, req.max_tokens_per_doc)
  sent = [d if isinstance(d, str) else d.text for d in req.documents]
  results = [schemas.JinaResult(
      index=p.index, relevance_score=relevance(p),
      document=schemas.DocumentText(text=sent[p.index]) if req.return_documents else None,
      relevant_spans=spans(p, req.relevant_spans)) for p in ranked.top_k(req.top_n or len(docs))]
  return schemas.JinaRerankResponse(id=request.state.request_id, model=state.settings.model_name,
                                    usage=usage(tokens), results=results)


@router.post("/v1/rerank", response_model=schemas.JinaRerankResponse,
             response_model_exclude_none=True, summary="Jina / vLLM rerank")
async def jina_v1(req: schemas.JinaRerankRequest, request: Request,
                  state: ServingState = Depends(serving_state)):
  return await jina_response(req, request, state)
