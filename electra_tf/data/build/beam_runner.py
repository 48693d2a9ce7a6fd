"""The Apache Beam side of the build's launcher: importing Beam, its pipeline options, the
one-line messages of errors raised on workers, and the manifest's runner entry (Beam's counters,
checked against the per-file results).

Beam is imported only when a runner is asked for (`import_beam`): without the `[beam]` extra
the local builder never touches this module's Beam code.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Dict, Optional, Sequence

from electra_tf import console
from electra_tf.data.text.corpus import CorpusError
from electra_tf.errors import BuildError
from electra_tf.vocab import VocabError

__all__ = ["BEAM_EXTRA", "BEAM_REQUIREMENT", "failed_write", "import_beam", "pipeline_options",
           "quiet_worker_errors", "read_counters", "runner_entry", "user_error"]

logger = logging.getLogger(__name__)

BEAM_EXTRA = "pip install -e '.[beam]'"
BEAM_REQUIREMENT = "apache-beam==2.77.0"
_BEAM_SUFFIX = re.compile(r" \[while running '[^']*'\]")
_USER_ERROR_LINE = re.compile(r"(?:BuildError|CorpusError|VocabError): (.+)")
_GCP_CLIENTS_WARNING = re.compile(r"^apitools not found")


def import_beam(runner: str):
    """Imports apache_beam, or raises BuildError naming the extra that installs it."""
    try:
        with _optional_gcp_warning_dropped():
            import apache_beam
    except ImportError as e:
        raise BuildError(f"--runner {runner} needs Apache Beam, which is not installed: "
                         f"{BEAM_EXTRA} (the [beam] extra: {BEAM_REQUIREMENT})") from e
    return apache_beam


class _DropRecord(logging.Filter):
    def __init__(self, pattern: "re.Pattern"):
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


@contextlib.contextmanager
def _optional_gcp_warning_dropped():
    """Importing Beam logs `apitools not found, and bigquery client libraries are not
    available ...` on the root logger (Google Cloud's optional clients, needed by BigQuery IO
    only, which the build does not use): dropped, unless --verbose. Also keeps that
    module-level `logging.warning` from calling `logging.basicConfig()` on an unconfigured
    root logger."""
    if console.verbose():
        yield
        return
    root = logging.getLogger()
    dropped = _DropRecord(_GCP_CLIENTS_WARNING)
    placeholder = logging.NullHandler() if not root.handlers else None
    if placeholder is not None:
        root.addHandler(placeholder)
    root.addFilter(dropped)
    try:
        yield
    finally:
        root.removeFilter(dropped)
        if placeholder is not None:
            root.removeHandler(placeholder)


def pipeline_options(runner: str, args: Sequence[str]):
    """Beam's PipelineOptions from `--runner` and the passed-through args; an arg that is not a
    Beam pipeline option is a BuildError (Beam itself would only log and drop it)."""
    import_beam(runner)
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    flags = ["--runner", runner] + list(args)
    parser = _BeamArgumentParser(allow_abbrev=False)
    for options_class in dict.fromkeys(PipelineOptions.__subclasses__()):
        options_class._add_argparse_args(parser)  # how Beam builds its own parser
    _, unknown = parser.parse_known_args(flags)
    if unknown:
        raise BuildError(f"unrecognized arguments: {' '.join(unknown)} (neither a flag of this "
                         f"script nor a Beam pipeline option)")
    return PipelineOptions(flags)


def user_error(error: BaseException) -> Optional[str]:
    """The one-line message of a user-facing error raised on a worker, or None (a bug).

    In-process runners re-raise the worker's exception with "[while running 'Step']"
    appended; remote ones (Dataflow) report its traceback as text, so the line is looked up.
    """
    found = _in_chain(error, (BuildError, CorpusError, VocabError))
    if found is not None:
        return _BEAM_SUFFIX.sub("", str(found)).strip().splitlines()[0]
    match = _USER_ERROR_LINE.search(str(error))
    return _BEAM_SUFFIX.sub("", match.group(1)).strip() if match else None


def failed_write(error: BaseException) -> Optional[BaseException]:
    """The OSError or TensorFlow file error in `error`'s chain (a write of the pipeline's: its
    reads of corpus files fail as BuildErrors), or None."""
    import tensorflow as tf

    return _in_chain(error, (OSError, tf.errors.OpError))


def _in_chain(error: BaseException, types: tuple) -> Optional[BaseException]:
    """The first exception of `types` among `error`, its cause and context, and theirs."""
    seen, current = set(), error
    while current is not None and id(current) not in seen:
        if isinstance(current, types):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


# ------------------------------------------------------------------------------------------------
# The manifest's runner entry
# ------------------------------------------------------------------------------------------------
# Beam counter -> the same number from the per-file results (totals: BuildTotals, n: files);
# "documents" counts document breaks read (progress), not documents, and is not checked.
COUNTER_CHECKS = {
    "files": lambda t, n: n,
    "bytes": lambda t, n: t.read.bytes_read,
    "tokens": lambda t, n: t.pack.tokenized_tokens,
    "examples": lambda t, n: sum(s.examples for s in t.pack.splits.values()),
    "written": lambda t, n: sum(s.examples for s in t.pack.splits.values()),
    "problems": lambda t, n: t.num_problems,
}


def read_counters(result) -> Dict[str, object]:
    """The pipeline's counters {"kind": "committed" or "attempted", "values": {name: n}}."""
    from apache_beam.metrics.metric import MetricsFilter

    # lazy: Apache Beam is optional (only a --runner build needs it)
    from electra_tf.data.build.beam_pipeline import COUNTER_NAMESPACE

    try:
        found = result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))
    except Exception as e:  # noqa: BLE001 -- some runners cannot report metrics
        logger.warning("the runner reported no counters (%s)", str(e).splitlines()[0][:200])
        return {"kind": None, "values": {}}
    values: Dict[str, Dict[str, int]] = {"committed": {}, "attempted": {}}
    for counter in found["counters"]:
        name = counter.key.metric.name
        for kind in values:
            value = getattr(counter, kind, None)
            if value is not None:
                values[kind][name] = values[kind].get(name, 0) + value
    kind = "committed" if values["committed"] else "attempted"
    return {"kind": kind, "values": dict(sorted(values[kind].items()))}


def runner_entry(beam, runner: str, beam_args: Sequence[str], result, totals,
                  num_files: int) -> dict:
    """Records the runner; checks exact (committed) counters against the data's counts."""
    counters = read_counters(result)
    if counters["kind"] == "committed":
        for name, expected in COUNTER_CHECKS.items():
            got = counters["values"].get(name, 0)
            want = expected(totals, num_files)
            if got != want:
                logger.warning("Beam counter %s = %d, but the per-file results count %d",
                               name, got, want)
    return {"name": runner, "engine": "apache_beam", "beam_version": beam.__version__,
            "pipeline_args": list(beam_args), "counters": counters}


@contextlib.contextmanager
def quiet_worker_errors():
    """Mutes Beam's log of a worker's exception (the launcher reports it as one line)."""
    common = logging.getLogger("apache_beam.runners.common")
    level = common.level
    common.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        common.setLevel(level)
