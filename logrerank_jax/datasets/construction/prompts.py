"""The two annotation prompt templates (sentence level, passage level), versioned together.

Bump `PROMPT_VERSION` whenever either template's wording or output schema
changes; the version is written into every request manifest so a set of
responses can always be traced to the exact prompt that produced it.

Output schemas the consolidator expects (strict JSON, nothing else):
  sentence level: {"units": [{"id": 1, "text": str, "fragment": bool,
                              "rank": int, "score": 1..5, "rationale": str}, ...]}
                  units in the passage's original order; rank 1 = most useful.
  passage level:  {"passages": [{"ref": int, "rank": int, "score": 1..5,
                                 "evidence": str}, ...]}
                  one entry per candidate, in the original (reference) order.
"""

from typing import Optional, Sequence

PROMPT_VERSION = "logrerank-appB-v1"

SYSTEM_MESSAGE = ("You annotate scientific text for training a reranker. You follow the "
                  "instructions exactly and answer with one strict JSON object only.")

SENTENCE_TEMPLATE = """\
Task: judge how much each sentence of one scientific passage helps to answer a question.

Step 1 - Split. Split the passage into sentence-like units. Keep them in their original order.
Copy each unit's text exactly from the passage: do not paraphrase, correct, merge across
sentences, or add words. If a unit is not a complete sentence (a heading, a caption
fragment, a truncated piece at the start or end of the passage, a list stub), still output
it but set "fragment": true.

Step 2 - Rank. Rank all units by how much each one helps answer the question, rank 1 = most
helpful, every rank used once. Use this order of preference:
  1. units that directly state an answer to the question;
  2. units that explain the mechanism behind it or give the supporting evidence (results,
     measurements, comparisons);
  3. units that name the entities, population, data or setting the answer depends on;
  4. units that offer only a weak or speculative interpretation;
  5. generic method descriptions or background that do not bear on the question.

Step 3 - Score and justify. Give each unit a score from 1 (no help) to 5 (direct answer)
that agrees with its rank (a better rank never has a lower score), and a rationale of at
most 20 words.

Output: one JSON object and nothing else, no code fences, no comments:
{{"units": [{{"id": 1, "text": "<exact unit text>", "fragment": false, "rank": 1, "score": 5,
"rationale": "<short reason>"}}, ...]}}
List the units in their original order (ids 1, 2, 3, ...).

Question: {question}
{answer_block}Passage title: {title}
Passage:
{text}
"""

ANSWER_BLOCK = """\
Reference answer (written from this passage; use it to recognise what answers the question):
{answer}
"""

PASSAGE_TEMPLATE = """\
Task: rank candidate scientific passages by how much each contributes to answering a
question and to supporting the reference answer.

Rules:
  - Rank every candidate, rank 1 = largest contribution, every rank used once.
  - Judge contribution to answering the question and to supporting the claims of the
    reference answer, not topical similarity alone.
  - Prefer complementary evidence: reward what a passage adds beyond better-ranked
    passages (its marginal contribution); a passage that only repeats evidence already
    given by a better-ranked one ranks lower.
  - Give each candidate a score from 1 (no contribution) to 5 (essential) that agrees with
    its rank, and an evidence summary of at most 25 words saying what it contributes.

Output: one JSON object and nothing else, no code fences, no comments, with the candidates
in their original order (the order listed below):
{{"passages": [{{"ref": 0, "rank": 2, "score": 4, "evidence": "<what it contributes>"}}, ...]}}

Question: {question}
Reference answer:
{answer}

Candidates:
{candidates}
"""


def include_gold_answer(subset: str, n_cited: int) -> bool:
  """Return whether the sentence prompt shows the gold answer (single-paper, one cited passage)."""
  # Only then is the answer known to come from this very passage; elsewhere it
  # would leak evidence from other passages into the sentence judgement.
  return subset == "single_paper" and n_cited == 1


def sentence_messages(question: str, title: str, text: str,
                      answer: Optional[str] = None) -> list[dict[str, str]]:
  """Return the chat messages of one sentence-ranking request."""
  block = ANSWER_BLOCK.format(answer=answer) if answer is not None else ""
  user = SENTENCE_TEMPLATE.format(question=question, answer_block=block,
                                  title=title or "(none)", text=text)
  return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": user}]


def passage_messages(question: str, answer: str,
                     candidates: Sequence[tuple[int, str, str]]) -> list[dict[str, str]]:
  """Return the chat messages of one passage-ranking request.

  Args:
    question: the instance's question.
    answer: the instance's gold answer.
    candidates: (reference index, title, text) per passage, in original order.
  """
  lines = [f"[{ref}] Title: {title or '(none)'}\nText: {text}" for ref, title, text in candidates]
  user = PASSAGE_TEMPLATE.format(question=question, answer=answer, candidates="\n\n".join(lines))
  return [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": user}]
