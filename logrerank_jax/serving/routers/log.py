"""POST /log/rerank: one OpenScholar record -> LoG's full "log" record (what `tools/rerank.py`
writes for it; the explanation page draws this answer)."""

from typing import Any, Dict

from fastapi import APIRouter, Body, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.errors import DataError
from logrerank_jax.serving.auth import require_key
from logrerank_jax.serving.http_errors import HttpError
from logrerank_jax.serving.scoring import require_ready, through_batcher
from logrerank_jax.serving.state import ServingState, serving_state

router = APIRouter(dependencies=[Depends(require_key)])


@router.post("/log/rerank", summary="LoG's full record (what tools/rerank.py writes)")
async def log_rerank(record: Dict[str, Any] = Body(...),
                     state: ServingState = Depends(serving_state)):
  require_ready(state)
  try:
    parsed = await run_in_threadpool(parse_inference_record, record, "body")
  except DataError as e:
    raise HttpError(422, str(e)) from None
  n = len(parsed.passages)
  max_documents = state.settings.max_documents
  if n > max_documents:
    raise HttpError(422, f"{parsed.passage_key}: {n} passages, more than the server's limit "
                    f"of {max_documents} (--max-documents)")
  result, _ = await through_batcher(state, parsed)
  return JSONResponse(result.to_dict())
