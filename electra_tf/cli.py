"""Command-line glue shared by the scripts: logging, user errors as one line, the exit codes.

Every command-line tool (electra_tf/commands/: electra-pretrain or run_pretraining.py, ...;
`python -m electra_tf.convert`) sets up logging once (`electra_tf.console`) and runs its work
through `run_cli`: a user error (`ElectraError`) or an environment error (`OSError`: a full
disk, a read-only directory) becomes one line on stderr, `PROG: error: MESSAGE`, and exit
status 2 (argparse's status for bad usage); Ctrl-C exits 130; a
run stopped by SIGTERM after saving a checkpoint exits 42.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

from electra_tf.errors import ElectraError, Preempted, error_line

EXIT_USER_ERROR = 2  # argparse's status for bad usage
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell convention
# Stopped by SIGTERM after saving a checkpoint: rerun to resume. TensorFlow's
# PreemptionCheckpointHandler exits with the same code by default off Google Cloud, and it is
# distinct from a crash (1), bad input (2), Ctrl-C (130) and a SIGTERM that killed a process
# before it could save (143 in a shell).
EXIT_PREEMPTED = 42


def run_cli(prog: str, work: Callable[[], Optional[int]],
            interrupted: str = "interrupted") -> int:
    """Runs `work()` for the tool `prog`, turning user errors and Ctrl-C into exit statuses.

    Args:
        prog: str. How the tool is invoked (`run_pretraining.py`), the prefix of error lines.
        work: the tool's body; returns None (or 0) on success, or its own exit status.
        interrupted: str. What to print after `prog: ` on Ctrl-C.

    Returns:
        0 (or what `work` returned), EXIT_USER_ERROR after a user error, EXIT_INTERRUPTED,
        EXIT_PREEMPTED after a stop on SIGTERM.
    """
    try:
        return work() or 0
    except Preempted as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_PREEMPTED
    except KeyboardInterrupt:
        print(f"{prog}: {interrupted}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ElectraError, OSError) as e:
        # OSError: the environment refused (a full disk, a read-only or missing path); its
        # message names the file. Anything else is a bug and keeps its traceback.
        if isinstance(e, OSError) and e.errno is None:
            raise
        print(f"{prog}: error: {error_line(e, limit=None, whole=True)}", file=sys.stderr)
        return EXIT_USER_ERROR
