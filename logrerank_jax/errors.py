"""The library's own error types: every bad input surfaces as one of these, in one line."""


class LogRerankError(ValueError):
  """Base class of every error the library raises on bad input or misuse."""


class ConfigError(LogRerankError):
  """A configuration is missing a key, has an unknown key, or holds a bad value."""


class CheckpointError(LogRerankError):
  """A checkpoint is unreadable, unsafe, or does not match the model it is loaded into."""


class DataError(LogRerankError):
  """An input record is malformed; the message names the file, line or record."""
