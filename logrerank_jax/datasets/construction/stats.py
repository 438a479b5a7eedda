"""The construction statistics report, in the shape of the paper's Table 6."""

import collections
import dataclasses
from typing import Any, Sequence

from logrerank_jax.schema import ROLE_NAMES
from logrerank_jax.data.records import TrainingRecord

# Why a sentence unit was removed, in report order.
REMOVAL_REASONS = ("fragment", "short", "unfaithful", "duplicate", "malformed", "no_role")


def hard_label(role: Sequence[float]) -> str:
  """Return the role name of the unique largest probability, or "tie" when the maximum is shared."""
  top = max(role)
  winners = [i for i, p in enumerate(role) if p == top]
  return ROLE_NAMES[winners[0]] if len(winners) == 1 else "tie"


@dataclasses.dataclass
class ConstructionStats:
  """Counts of one consolidation run; `units_before == units_after + sum(removed.values())`."""
  instances_extracted: int = 0
  instances: int = 0                       # instances with >= 1 passage in the output
  single_paper: int = 0
  multi_paper: int = 0
  passage_pairs: int = 0                   # (question, passage) pairs in the output
  units_before: int = 0                    # units in parsed sentence responses
  units_after: int = 0                     # sentences in the output
  removed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  hard_labels: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def add_records(self, records: Sequence[TrainingRecord], subsets: dict[str, str]):
    """Count the output records (`subsets` maps record id -> "single_paper" / "multi_paper")."""
    for r in records:
      self.instances += 1
      if subsets[r.id] == "single_paper":
        self.single_paper += 1
      else:
        self.multi_paper += 1
      self.passage_pairs += len(r.passages)
      for p in r.passages:
        self.units_after += len(p.sentences)
        for s in p.sentences:
          self.hard_labels[hard_label(s.role)] += 1

  def role_shares(self) -> dict[str, float]:
    """Return the share (percent) of output sentences per hard label (and "tie")."""
    n = sum(self.hard_labels.values())
    return {k: (100.0 * self.hard_labels[k] / n if n else 0.0) for k in ROLE_NAMES + ("tie",)}

  def to_json(self) -> dict[str, Any]:
    """Return the report as a JSON-ready dict."""
    return {"instances_extracted": self.instances_extracted, "instances": self.instances,
            "single_paper": self.single_paper, "multi_paper": self.multi_paper,
            "passage_pairs": self.passage_pairs, "units_before": self.units_before,
            "units_after": self.units_after,
            "removed": {k: self.removed[k] for k in REMOVAL_REASONS},
            "hard_labels": {k: self.hard_labels[k] for k in ROLE_NAMES + ("tie",)},
            "role_shares_percent": self.role_shares()}

  def table(self) -> str:
    """Return the Markdown table (rows as in the paper's Table 6, plus the other removals)."""
    shares = self.role_shares()
    rows = [
        ("Instances", f"{self.instances:,}"),
        ("  single-paper QA", f"{self.single_paper:,}"),
        ("  multi-paper QA", f"{self.multi_paper:,}"),
        ("Query-passage pairs", f"{self.passage_pairs:,}"),
        ("Sentence units before filtering", f"{self.units_before:,}"),
        ("Sentence units after filtering", f"{self.units_after:,}"),
        ("Fragments removed", f"{self.removed['fragment']:,}"),
        ("Short units removed", f"{self.removed['short']:,}"),
    ]
    rows += [(f"Other units removed ({k})", f"{self.removed[k]:,}")
             for k in REMOVAL_REASONS[2:] if self.removed[k]]
    rows += [(f"Hard-label role share: {k}", f"{shares[k]:.1f}%") for k in ROLE_NAMES]
    if self.hard_labels["tie"]:
      rows.append(("Hard-label role share: tie (no unique max)", f"{shares['tie']:.1f}%"))
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'Statistic'.ljust(width)} | Value |", f"| {'-' * width} | ----- |"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"
