"""POST /v2/rerank: Cohere v2 rerank, with `relevant_spans` (LoG's ranked sentences)."""

from fastapi import APIRouter, Depends, Request

from logrerank_jax.serving import schemas
from logrerank_jax.serving.auth import require_key
from logrerank_jax.serving.scoring import relevance, score, spans
from logrerank_jax.serving.state import ServingState, serving_state

router = APIRouter(dependencies=[Depends(require_key)])


@router.post("/v2/rerank", response_model=schemas.CohereRerankResponse,
             response_model_exclude_none=True, summary="Cohere v2 rerank (with relevant_spans)")
async def cohere_v2(req: schemas.CohereRerankRequest, request: Request,
                    state: ServingState = Depends(serving_state)):
  docs = [{"text": d, "title": ""} for d in req.documents]
  ranked, tokens, _ = await score(state, req.query, docs, req.max_tokens_per_doc)
  results = [schemas.CohereResult(index=p.index, relevance_score=relevance(p),
                                  relevant_spans=spans(p, req.relevant_spans))
             for p in ranked.top_k(req.top_n or len(docs))]
  return schemas.CohereRerankResponse(
      id=request.state.request_id, results=results,
      meta=schemas.CohereMeta(tokens=schemas.CohereTokens(input_tokens=tokens)))
