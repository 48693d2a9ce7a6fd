"""The checks a run makes of its datasets before anything is written (both trainers).

Free of TensorFlow: the trainer on the JAX and PyTorch backends runs them too.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

from electra_tf.config import PretrainingConfig
from electra_tf.data.records import integrity
from electra_tf.vocab import Vocab

logger = logging.getLogger("electra_tf")


def check_datasets(config: PretrainingConfig, vocab: Vocab) -> Dict[str, dict]:
    """Validates the splits this run reads (manifest, vocab, sequence length, records).

    Runs before anything is written or deleted. Returns {"train"/"eval": summary} (see
    `integrity.validate_dataset`); problems skipped under `skip_bad_records` are logged.
    """
    splits = {"train": (config.do_train, config.pretrain_tfrecords),
              "eval": (config.do_eval, config.eval_tfrecords)}
    summaries = {}
    for split, (needed, patterns) in splits.items():
        if needed:
            summaries[split] = integrity.validate_dataset(
                patterns, max_seq_length=config.max_seq_length, vocab_sha256=vocab.sha256,
                vocab_size=config.vocab_size, split=split, verify=config.verify_tfrecords,
                skip_bad_records=config.skip_bad_records)
    for split, summary in summaries.items():
        for problem in summary.get("problems", ()):
            logger.warning("skip_bad_records (%s data): %s", split, problem)
        if summary.get("skipped_records"):
            logger.warning("skip_bad_records: %d %s record(s) skipped, %d used",
                           summary["skipped_records"], split, summary["num_examples"])
    return summaries


def record_plan(summaries: Dict[str, dict], split: str) -> Optional[dict]:
    """The good records to read (`skip_bad_records`), or None to read every record."""
    return summaries.get(split, {}).get("record_plan")
