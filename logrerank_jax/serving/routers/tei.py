"""POST /rerank: TEI's rerank (`texts` -> [{index, score, text?}]), or the Jina / vLLM shape
when the body has `documents` (`schemas.AnyRerankRequest` tells them apart)."""

import math
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from logrerank_jax.serving import schemas
from logrerank_jax.serving.routers.jina_vllm import jina_response
from logrerank_jax.serving.scoring import relevance, score
from logrerank_jax.serving.state import ServingState, serving_state

# float32's resolution next to 1: a sigmoid score clipped here before its logit is taken.
_EPS32 = 2.0 ** -24

router = APIRouter()


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
    if req.raw_scores:  # the logit of the final score (sigmoid) LoG ranks by
      c = min(max(s, _EPS32), 1.0 - _EPS32)
      s = math.log(c) - math.log1p(-c)
    out.append({"index": p.index, "score": s, **({"text": req.texts[p.index]}
                                                   if req.return_text else {})})
  return JSONResponse(out)
