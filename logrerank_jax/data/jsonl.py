"""Reading JSON-lines files: the loop the pool, corpus, teacher, role and instance readers share.

Each caller words its own errors (its messages are part of its contract, tested by name): the
reader hands it the open error's reason and each line's decode error instead of raising them.
"""

import json
from typing import Any, Callable, Iterator, Optional, Tuple

from logrerank_jax.errors import DataError


def read_json_lines(path, cannot_read: Optional[Callable[[str], str]] = None
                    ) -> Iterator[Tuple[int, Any, Optional[json.JSONDecodeError]]]:
  """Yield (line number from 1, JSON value, None) or (line number, None, its decode error) for
  each non-blank line of `path`, in order, as the file is read.

  Args:
    path: the file (UTF-8).
    cannot_read: the message of the `DataError` raised when the file cannot be opened, from
      the reason (`strerror`); None lets the `OSError` itself through.

  Raises:
    DataError: the file cannot be opened (with `cannot_read`).
  """
  try:
    f = open(path, encoding="utf-8")
  except OSError as e:
    if cannot_read is None:
      raise
    raise DataError(cannot_read(e.strerror or str(e))) from None
  with f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        value = json.loads(line)
      except json.JSONDecodeError as e:
        yield lineno, None, e
        continue
      yield lineno, value, None
