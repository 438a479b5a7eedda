"""Cohere's `max_tokens_per_doc`: each document cut to its first N tokens of the model's
tokenizer, as a prefix of the text the client sent (so span offsets still index it)."""

from typing import List, Optional


def cut(state, texts: List[str], max_tokens: Optional[int]) -> List[str]:
  """Each text cut after its first `max_tokens` tokens of the model's tokenizer (Cohere's
  `max_tokens_per_doc`); a prefix, so offsets still index the text the client sent.

  `state` is the app's `ServingState`: its own copy of the tokenizer, used under its lock."""
  if not max_tokens:
    return texts
  with state.cut_lock:
    enc = state.cut_tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
  out = []
  for text, offsets in zip(texts, enc["offset_mapping"]):
    out.append(text if len(offsets) <= max_tokens else text[:offsets[max_tokens - 1][1]])
  return out
