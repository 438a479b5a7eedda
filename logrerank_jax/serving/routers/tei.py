"""POST /rerank: TEI's rerank (`texts` -> [{index, score, text?}]), or the Jina / vLLM shape
when the body has `documents` (`schemas.AnyRerankRequest` tells them apart)."""

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from logrerank_jax.serving import schemas
from logrerank_jax.serving.auth import require_key
from logrerank_jax.serving.routers.jina_vllm import jina_response
from logrerank_jax.serving.scoring import raw_logit, relevance, score
from logrerank_jax.serving.state import ServingState, serving_state

router = APIRouter(dependencies=[Depends(require_key)])


@router.post("/rerank", response_model=Any,
             summary="TEI rerank (texts) or Jina / vLLM (documents)")
async def rerank(req: schemas.AnyRerankRequest, request: Request,
                 state: ServingState = Depends(serving_state)):
  if isinstance(req, schemas.JinaRerankRequest):
    out = await jina_response(req, request, state)
    return JSONResponse(out.model_dump(exclude_none=True))
  docs = [{"text": t, "title": ""} for t in req.texts]
  ranked, _, _ = await score(state, req.query, docs)
  out = []
  for p in ranked:
    s = relevance(p)
    if req.raw_scores:  # the logit LoG ranks by, under the (calibrated) sigmoid score
      s = raw_logit(state, s)
    out.append({"index": p.index, "score": s, **({"text": req.texts[p.index]}
                                                   if req.return_text else {})})
  return JSONResponse(out)
