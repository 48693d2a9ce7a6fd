"""What a pretraining run lets watch it: an observer called between training loops.

The run knows observers only through this interface (the learning probe, built by the
pretraining command from `finetuning.probe`, is one), so training/ imports nothing of what an
observer needs. An observer runs outside the compiled step and must not draw from the run's
random streams or read its data: a run trains bit for bit as it would without it.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol

from electra_tf.config import PretrainingConfig
from electra_tf.errors import TrainingError
from electra_tf.vocab import Vocab

# Examples per forward pass an observer is given per device (a multiple of the devices under
# Keras' data parallelism: this times their number).
BATCH_SIZE = 64


class RunObserver(Protocol):
    """Called by the run after every training loop (and at a fresh run's step 0)."""

    def observe(self, previous_step: int, step: int, end_step: int,
                encoder) -> Dict[str, float]:
        """Scalars to log at `step` beside the losses ({} when it has nothing to say).

        Args:
            previous_step: int. The step before the loop just trained (== step at the start).
            step: int. The run's step now.
            end_step: int. The step this train() call ends at.
            encoder: the discriminator encoder, current weights (read only).
        """

    def results(self) -> List[dict]:
        """Everything it observed in this process, for the run's results ("probe")."""


# (config, vocab, examples per forward pass, several hosts) -> an observer, or None when the
# config asks for none. Called after the input checks, before the run directory is written, so
# an observer's bad input stops the run before anything is written.
ObserverFactory = Callable[[PretrainingConfig, Vocab, int, bool], Optional[RunObserver]]


def build(factory: Optional[ObserverFactory], config: PretrainingConfig, vocab: Vocab,
          batch_size: int, several_hosts: bool = False) -> Optional[RunObserver]:
    """The run's observer from `factory` (None: none).

    Raises:
        TrainingError: the config has the `probe` hparam but no factory was given (the
            pretraining command gives `finetuning.probe.for_run`).
    """
    if factory is None:
        if config.probe is not None and config.do_train:
            raise TrainingError("hparam probe: this run was given no learning probe; run it "
                                "with the pretraining command (electra-pretrain), or pass "
                                "observers=electra_tf.finetuning.probe.for_run to run()")
        return None
    return factory(config, vocab, batch_size, several_hosts)
